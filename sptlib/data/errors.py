"""Errors raised on bad or missing data; every message names the file (and line) at fault."""

from sptlib.errors import DataError  # noqa: F401  (the library-wide type, re-exported here)


def located(path, line, message):
    """Returns a `DataError` whose message starts with `path:line:` (line is 1-based)."""
    where = f"{path}:{line}" if line is not None else str(path)
    return DataError(f"{where}: {message}")
