"""Errors raised on bad or missing data; every message names the file (and line) at fault."""


class DataError(ValueError):
    """Malformed or missing data files."""


def located(path, line, message):
    """Returns a `DataError` whose message starts with `path:line:` (line is 1-based)."""
    where = f"{path}:{line}" if line is not None else str(path)
    return DataError(f"{where}: {message}")
