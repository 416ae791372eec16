"""Logging set-up shared by the command-line entry points (`sptlib.main`, `sptlib.compare`)."""

import logging as pylogging


class _LibraryInfoFilter(pylogging.Filter):
    """Drops INFO/DEBUG records of chatty libraries (orbax logs every file of every save)."""

    _QUIET = ("/orbax/", "/grain/")

    def filter(self, record):
        if str(record.msg).startswith("Requested `tracked_metric`"):
            return False  # orbax, on every checkpoint saved between evaluations: expected here
        return record.levelno >= pylogging.WARNING or not any(
            q in record.pathname for q in self._QUIET)


def quiet_library_logs():
    """Keeps orbax's and grain's INFO chatter out of the absl log; warnings still show."""
    pylogging.getLogger("absl").addFilter(_LibraryInfoFilter())
