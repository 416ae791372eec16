"""Column values of the user's files -> checked NumPy arrays (`sptlib.data.user_files`).

A chunk's column arrives as a pyarrow array (Parquet, CSV), a NumPy array (.npy/.npz) or a list of
Python values (JSON Lines); each function here turns it into one representation and raises a
one-line `DataError` naming the file, row and column of the first bad value:

  token ids   (flat int64 [total], offsets int64 [rows + 1])
  floats      (flat float64 [total, channels], offsets)       every position `channels` wide
  text        list of str
  labels      int64 [rows] or an object array of str
"""

from __future__ import annotations

import json

import numpy as np

from sptlib.errors import DataError

KINDS = ("tokens", "text", "floats")


class Where:
    """Names a chunk's rows in messages: `where(i, "msg")` -> "path: row R, column 'c': msg"."""

    def __init__(self, table, role, start):
        self.table, self.start = table, start
        self.column = table.columns[role]

    def __call__(self, i, message):
        row = self.table.row_name(self.start + int(i))
        return DataError(f"{self.table.path}: row {row}, column {self.column!r}: {message}")


def _is_arrow(values):
    return type(values).__module__.startswith("pyarrow")


def _arrow_list(values):
    import pyarrow as pa
    return pa.types.is_list(values.type) or pa.types.is_large_list(values.type)


def _cell(v, where, i):
    """A text cell of a CSV holding a sequence: JSON ("[1, 2]") or whitespace-separated."""
    s = v.strip()
    if s.startswith("["):
        try:
            return json.loads(s)
        except json.JSONDecodeError as e:
            raise where(i, f"not a JSON list ({e.msg})") from None
    return s.split()


def _python_rows(values, where):
    """A column as a list of Python values (nulls are an error)."""
    rows = values.to_pylist() if _is_arrow(values) else list(values)
    for i, v in enumerate(rows):
        if v is None:
            raise where(i, "empty (null) value")
    return rows


def infer_kind(values):
    """tokens | text | floats from the first value of a column."""
    if isinstance(values, np.ndarray):
        return "tokens" if np.issubdtype(values.dtype, np.integer) else "floats"
    if _is_arrow(values):
        import pyarrow as pa
        t = values.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            first = next((v for v in values.to_pylist()[:1]), "")
            return _kind_of_text_cell(first)
        if _arrow_list(values):
            inner = t.value_type
            return "tokens" if pa.types.is_integer(inner) else "floats"
        return "floats"
    first = values[0] if len(values) else []
    if isinstance(first, str):
        return "text"
    flat = np.asarray(first if first else [0], dtype=object).ravel()
    return "tokens" if all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                           for x in flat) else "floats"


def _kind_of_text_cell(first):
    """A CSV cell: a JSON list or numbers separated by spaces are a sequence; else text."""
    s = str(first).strip()
    if s.startswith("["):
        try:
            return "tokens" if all(isinstance(x, int) for x in json.loads(s)) else "floats"
        except (json.JSONDecodeError, TypeError):
            return "text"
    parts = s.split()
    if parts and all(p.lstrip("-").isdigit() for p in parts):
        return "tokens"
    return "text"


def _offsets(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def tokens(values, where):
    """Token ids of a column -> (flat int64, offsets)."""
    if isinstance(values, np.ndarray):
        if not np.issubdtype(values.dtype, np.integer):
            raise where(0, f"token ids must be integers, got {values.dtype}")
        if values.ndim != 2:
            raise where(0, f"token ids of shape {values.shape[1:]} per row; expected [length]")
        n, length = values.shape
        return np.asarray(values, np.int64).reshape(-1), np.arange(n + 1, dtype=np.int64) * length
    if _is_arrow(values) and _arrow_list(values):
        import pyarrow as pa
        if not pa.types.is_integer(values.type.value_type):
            raise where(0, f"token ids must be integers, got {values.type.value_type}")
        if values.null_count:
            raise where(int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0]),
                        "empty (null) value")
        offsets = values.offsets.to_numpy().astype(np.int64)
        flat = values.flatten().to_numpy(zero_copy_only=False)
        return flat.astype(np.int64), offsets - offsets[0]
    rows = _python_rows(values, where)
    out = []
    for i, v in enumerate(rows):
        if isinstance(v, str):
            v = _cell(v, where, i)
        if not isinstance(v, (list, tuple)):
            raise where(i, f"expected a list of token ids, got {type(v).__name__}")
        try:
            a = np.asarray([int(x) if not isinstance(x, (bool, float)) else _bad_id(x)
                            for x in v], np.int64)
        except (TypeError, ValueError) as e:
            raise where(i, f"token ids must be integers ({e})") from None
        out.append(a)
    flat = np.concatenate(out) if out else np.zeros(0, np.int64)
    return flat, _offsets([len(a) for a in out])


def _bad_id(x):
    raise ValueError(f"{x!r} is not an integer")


def floats(values, where):
    """Float arrays `[length]` or `[length, channels]` -> (flat float64 [total, channels],
    offsets); ragged positions, NaN and infinity are errors."""
    if isinstance(values, np.ndarray):
        a = np.asarray(values, np.float64)
        if a.ndim == 2:
            a = a[..., None]
        n, length, c = a.shape
        flat, offsets = a.reshape(n * length, c), np.arange(n + 1, dtype=np.int64) * length
    elif _is_arrow(values) and _arrow_list(values) and not _arrow_list(values.flatten()):
        offsets = values.offsets.to_numpy().astype(np.int64)
        flat = values.flatten().to_numpy(zero_copy_only=False).astype(np.float64)[:, None]
        offsets = offsets - offsets[0]
    elif _is_arrow(values) and _arrow_list(values):
        outer = values.offsets.to_numpy().astype(np.int64)
        outer = outer - outer[0]
        inner = values.flatten()
        widths = inner.value_lengths().to_numpy(zero_copy_only=False)
        c = int(widths[0]) if len(widths) else 1
        bad = np.flatnonzero(widths != c)
        if len(bad):
            p = int(bad[0])
            row = int(np.searchsorted(outer, p, side="right")) - 1
            raise where(row, f"ragged float array: position {p - outer[row]} has "
                             f"{widths[p]} channels, the first position {c}")
        flat = inner.flatten().to_numpy(zero_copy_only=False).astype(np.float64).reshape(-1, c)
        offsets = outer
    else:
        flat, offsets = _python_floats(_python_rows(values, where), where)
    finite = np.isfinite(flat).all(axis=1)
    if not finite.all():
        p = int(np.flatnonzero(~finite)[0])
        row = int(np.searchsorted(offsets, p, side="right")) - 1
        ch = int(np.flatnonzero(~np.isfinite(flat[p]))[0])
        raise where(row, f"non-finite value {flat[p, ch]} at position {p - offsets[row]}, "
                         f"channel {ch}")
    return flat, offsets


def _python_floats(rows, where):
    out, channels = [], None
    for i, v in enumerate(rows):
        if isinstance(v, str):
            v = _cell(v, where, i)
        try:
            a = np.asarray(v, np.float64)
        except (ValueError, TypeError):
            lens = sorted({len(p) for p in v if isinstance(p, (list, tuple))})
            raise where(i, f"ragged float array (positions of {lens} channels)" if len(lens) > 1
                        else "not an array of numbers") from None
        if a.ndim == 1:
            a = a[:, None]
        if a.ndim != 2:
            raise where(i, f"float array of shape {a.shape}; expected [length] or "
                           f"[length, channels]")
        if channels is None:
            channels = a.shape[1]
        elif a.shape[1] != channels:
            raise where(i, f"{a.shape[1]} channels, earlier rows {channels}")
        out.append(a)
    flat = np.concatenate(out) if out else np.zeros((0, channels or 1))
    return flat, _offsets([len(a) for a in out])


def texts(values, where):
    """Text cells -> list of str."""
    rows = _python_rows(values, where)
    for i, v in enumerate(rows):
        if not isinstance(v, str):
            raise where(i, f"expected text, got {type(v).__name__}")
    return rows


def labels(values, where, int_column):
    """Labels -> int64 [rows] when `int_column` (the train split's labels are integers), else an
    object array of str."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise where(0, f"labels of shape {values.shape}; expected [rows]")
        if np.issubdtype(values.dtype, np.integer):
            return np.asarray(values, np.int64)
        if int_column:
            raise where(0, f"labels must be integers, got {values.dtype}")
        return values.astype(str).astype(object)
    rows = _python_rows(values, where)
    if not int_column:
        return np.asarray([str(v) for v in rows], dtype=object)
    out = np.zeros(len(rows), np.int64)
    for i, v in enumerate(rows):
        if isinstance(v, bool) or not isinstance(v, (int, str)) or (
                isinstance(v, str) and not v.strip().lstrip("-").isdigit()):
            raise where(i, f"label {v!r} is not an integer (this column holds integers)")
        out[i] = int(v)
    return out


def is_int_labels(values):
    """Whether a (train) label column holds integers: integer type, or text cells most of which
    read as integers (then a non-integer cell is an error, not a new class)."""
    if isinstance(values, np.ndarray):
        return bool(np.issubdtype(values.dtype, np.integer))
    if _is_arrow(values):
        import pyarrow as pa
        if pa.types.is_integer(values.type):
            return True
        values = values.to_pylist()
    ints = sum(isinstance(v, int) and not isinstance(v, bool) or
               isinstance(v, str) and v.strip().lstrip("-").isdigit() for v in values)
    return ints * 2 > len(values)


def text_cells(values):
    """Whether a label column holds text (CSV/TSV cells, JSON strings) rather than integers:
    integer-looking text ("1", "2") names classes (`sptlib.data.user_files`), not class ids."""
    if isinstance(values, np.ndarray):
        return False
    if _is_arrow(values):
        import pyarrow as pa
        return pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
    return any(isinstance(v, str) for v in values)
