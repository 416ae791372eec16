"""Errors raised on bad or missing data; every message names the file (and line) at fault."""

from sptlib.errors import DataError  # noqa: F401  (the library-wide type, re-exported here)


def located(path, line, message):
    """Returns a `DataError` whose message starts with `path:line:` (line is 1-based)."""
    where = f"{path}:{line}" if line is not None else str(path)
    return DataError(f"{where}: {message}")


def int_label(text, path, line, num_classes):
    """`text` as a class id in [0, num_classes), else a `located` error naming the bad label."""
    try:
        label = int(text)
    except ValueError:
        raise located(path, line, f"label {text!r} is not an integer") from None
    if not 0 <= label < num_classes:
        raise located(path, line, f"label {label} outside 0..{num_classes - 1}")
    return label
