"""Logging set-up shared by the command-line entry points (`sptlib.main`, `sptlib.compare`)."""

import logging as pylogging
import os


class _LibraryInfoFilter(pylogging.Filter):
    """Drops INFO/DEBUG records of chatty libraries (orbax logs every file of every save)."""

    _QUIET = ("/orbax/", "/grain/")

    def filter(self, record):
        if str(record.msg).startswith("Requested `tracked_metric`"):
            return False  # orbax, on every checkpoint saved between evaluations: expected here
        if str(record.msg).startswith("Metadata file does not exist") and \
                "/orbax/" in record.pathname:
            return False  # orbax, on the partial (backbone-only) restore of init_from: expected
        return record.levelno >= pylogging.WARNING or not any(
            q in record.pathname for q in self._QUIET)


def quiet_library_logs():
    """Keeps library chatter that is not about the user's run out of the log; warnings still show.

    - orbax's and grain's INFO records (every file of every checkpoint save);
    - jax's "Unable to initialize backend 'tpu'" (INFO, on every CPU-only start);
    - TensorFlow's C++ start-up lines (oneDNN notice and absl's "All log messages before
      absl::InitializeLog()"): TF is imported later (clu writers, TFDS), so setting its
      environment here is early enough; grain's spawned workers inherit it. TF only writes event
      files and reads datasets for us, so its oneDNN kernels are not needed.
    """
    pylogging.getLogger("absl").addFilter(_LibraryInfoFilter())
    pylogging.getLogger("jax._src.xla_bridge").setLevel(pylogging.WARNING)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
