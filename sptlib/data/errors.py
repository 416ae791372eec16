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


BOM = b"\xef\xbb\xbf"


def decode_line(raw: bytes, path, line) -> str:
    """One line of a text file as str (no line ending); a UTF-8 byte-order mark on the first
    line is dropped; bytes that are not UTF-8 are a `located` error naming the column."""
    if line == 1 and raw.startswith(BOM):
        raw = raw[len(BOM):]
    raw = raw.rstrip(b"\n").rstrip(b"\r")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise located(path, line, f"not UTF-8 text: byte 0x{raw[e.start]:02x} at column "
                                  f"{e.start + 1}; save the file as UTF-8") from None
