"""Readers of the user's own data files (`config.data.task = "files"`, `sptlib.data.user_files`).

One `open_table(path, fmt, columns)` per split file returns a `Table`: its number of rows, its
chunks (`(first_row, {column: values})`, read in order, for the one inference scan) and random
access to the chunk that holds a row (for the training sources). Values of a column are a pyarrow
array (Parquet, CSV/TSV), a NumPy array (.npy/.npz) or a list of Python values (JSON Lines).

  Parquet      pyarrow.parquet; one chunk per row group, each read on demand (streams: memory
               is a few row groups, whatever the file's size).
  CSV / TSV    pyarrow.csv, the whole file in memory; token ids and float arrays are cells such
               as "3 17 5" or a JSON list "[[0.1, 2.0], [0.3, 1.0]]".
  JSON Lines   one JSON object per line (`json`), the whole file in memory.
  .npy         memory-mapped: inputs `[rows, length]` (token ids or floats) or `[rows, length,
               channels]`; labels, if any, in `<stem>.<label_column>.npy` beside it.
  .npz         arrays named by the columns (`inputs`, `label`), loaded whole.

Rows in messages are 1-based records (CSV: the header is not a row; JSON Lines: the line).
"""

from __future__ import annotations

import difflib
import json
import os
import threading

import numpy as np

from sptlib.errors import DataError

FORMATS = ("jsonl", "csv", "tsv", "parquet", "npy", "npz")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv",
               ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet", ".npy": "npy",
               ".npz": "npz"}
NPY_CHUNK = 4096  # rows per chunk of a memory-mapped .npy scan


def detect_format(path, fmt="auto"):
    """The format of `path`: `fmt` unless 'auto', else from the extension."""
    if fmt != "auto":
        if fmt not in FORMATS:
            raise DataError(f"config.data.files.format={fmt!r}: expected auto or one of "
                            f"{', '.join(FORMATS)}")
        return fmt
    ext = os.path.splitext(str(path))[1].lower()
    if ext not in _EXTENSIONS:
        raise DataError(f"{path}: cannot tell the format from the extension {ext!r}; use one of "
                        f"{', '.join(sorted(_EXTENSIONS))} or set config.data.files.format")
    return _EXTENSIONS[ext]


def missing_column(path, column, present, key):
    """The one-line error for a column that a file lacks (with the closest name, if any)."""
    close = difflib.get_close_matches(column, list(present), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return DataError(f"{path}: no column {column!r} (config.data.files.{key}); the file has "
                     f"{', '.join(map(repr, present)) or 'none'}{hint}")


class Table:
    """One split file. `columns`: {role: column name} (roles: inputs, label)."""

    def __init__(self, path, columns):
        self.path = str(path)
        self.columns = dict(columns)
        self.num_rows = 0
        self.line_of = None  # JSON Lines: row index -> line number (1-based)

    def row_name(self, i):
        """The 1-based row (JSON Lines: line) of row index `i`, for messages."""
        return int(self.line_of[i]) if self.line_of is not None else int(i) + 1

    def chunks(self):
        """Yields `(first_row, {role: values})` over the whole file, in order."""
        raise NotImplementedError

    def chunk_of(self, i):
        """`(first_row, {role: values})` of the chunk that holds row `i`."""
        raise NotImplementedError

    def _check_columns(self, present):
        for role, name in self.columns.items():
            if name not in present:
                key = "input_column" if role == "inputs" else "label_column"
                raise missing_column(self.path, name, present, key)


class _InMemory(Table):
    """A table read whole: one chunk."""

    def __init__(self, path, columns, data, num_rows):
        super().__init__(path, columns)
        self._data = data
        self.num_rows = num_rows

    def chunks(self):
        yield 0, self._data

    def chunk_of(self, i):
        return 0, self._data


def _read_jsonl(path, columns):
    values = {role: [] for role in columns}
    lines = []
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise DataError(f"{path}: row {line_no}: not a JSON object ({e})") from None
            if not isinstance(rec, dict):
                raise DataError(f"{path}: row {line_no}: expected a JSON object, got "
                                f"{type(rec).__name__}")
            for role, name in columns.items():
                if name not in rec:
                    key = "input_column" if role == "inputs" else "label_column"
                    err = missing_column(path, name, list(rec), key)
                    raise DataError(str(err).replace(f"{path}:", f"{path}: row {line_no}:", 1))
                values[role].append(rec[name])
            lines.append(line_no)
    t = _InMemory(path, columns, values, len(lines))
    t.line_of = np.asarray(lines, np.int64)
    return t


def _read_csv(path, columns, delimiter):
    import pyarrow as pa
    import pyarrow.csv as pacsv
    names = list(dict.fromkeys(columns.values()))
    try:
        # Every named column as text first: types are decided by the scan, which can then name
        # the row of a bad cell (pyarrow's own inference would only fail for the whole file).
        table = pacsv.read_csv(path, parse_options=pacsv.ParseOptions(delimiter=delimiter),
                               convert_options=pacsv.ConvertOptions(
                                   column_types={n: pa.string() for n in names}))
    except pa.ArrowInvalid as e:
        raise DataError(f"{path}: not a readable {'TSV' if delimiter == chr(9) else 'CSV'} "
                        f"file ({' '.join(str(e).split())})") from None
    present = table.column_names
    t = _InMemory(path, columns, {}, table.num_rows)
    t._check_columns(present)
    t._data = {role: table.column(name).combine_chunks() for role, name in columns.items()}
    return t


class ParquetTable(Table):
    """A Parquet file read one row group at a time (a small cache of decoded row groups)."""

    def __init__(self, path, columns, cache_size=2):
        super().__init__(path, columns)
        import pyarrow.parquet as pq
        try:
            f = pq.ParquetFile(path)
        except Exception as e:  # pyarrow raises ArrowInvalid / OSError for a bad file
            raise DataError(f"{path}: not a readable Parquet file "
                            f"({' '.join(str(e).split())[:200]})") from None
        self._check_columns(f.schema_arrow.names)
        meta = f.metadata
        self.num_rows = meta.num_rows
        self._starts = np.concatenate(
            [[0], np.cumsum([meta.row_group(g).num_rows for g in range(meta.num_row_groups)])])
        self._cache_size = cache_size
        self._file = None
        self._cache = {}
        self._lock = threading.Lock()

    def __getstate__(self):  # grain worker processes: reopen the file there
        state = dict(self.__dict__)
        state.update(_file=None, _cache={}, _lock=None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _read(self, g):
        import pyarrow.parquet as pq
        if self._file is None:
            self._file = pq.ParquetFile(self.path)
        names = list(dict.fromkeys(self.columns.values()))
        # One thread: grain's read threads already read row groups side by side.
        rg = self._file.read_row_group(g, columns=names, use_threads=False)
        return int(self._starts[g]), {role: rg.column(name).combine_chunks()
                                      for role, name in self.columns.items()}

    def chunks(self):
        for g in range(len(self._starts) - 1):
            yield self._read(g)

    def chunk_of(self, i):
        g = int(np.searchsorted(self._starts, i, side="right")) - 1
        with self._lock:
            hit = self._cache.get(g)
            if hit is None:
                hit = self._read(g)
                if len(self._cache) >= self._cache_size:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[g] = hit
        return hit


class NpyTable(Table):
    """A memory-mapped .npy of inputs (+ `<stem>.<label>.npy`), scanned `NPY_CHUNK` rows at a
    time."""

    def __init__(self, path, columns):
        super().__init__(path, columns)
        self._open()
        self.num_rows = len(self._arrays["inputs"])

    def __getstate__(self):  # grain worker processes map the files again (no copy)
        state = dict(self.__dict__)
        state["_arrays"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._open()

    def _open(self):
        path, columns = self.path, self.columns
        self._arrays = {"inputs": _load_npy(path)}
        if "label" in columns:
            stem = os.path.splitext(path)[0]
            label_path = f"{stem}.{columns['label']}.npy"
            if not os.path.exists(label_path):
                raise DataError(f"{path}: its labels belong in {label_path} (config.data.files."
                                f"label_column={columns['label']!r}), not found; set "
                                f"label_column='' for data without labels")
            self._arrays["label"] = _load_npy(label_path, ndims=(1,))
            if len(self._arrays["label"]) != len(self._arrays["inputs"]):
                raise DataError(f"{label_path}: {len(self._arrays['label'])} labels for "
                                f"{len(self._arrays['inputs'])} rows of {path}")

    def chunks(self):
        for s in range(0, self.num_rows, NPY_CHUNK):
            yield s, {k: v[s:s + NPY_CHUNK] for k, v in self._arrays.items()}

    def chunk_of(self, i):
        s = (i // NPY_CHUNK) * NPY_CHUNK
        return s, {k: v[s:s + NPY_CHUNK] for k, v in self._arrays.items()}


def _load_npy(path, ndims=(2, 3)):
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:  # object arrays (ragged rows) need pickle: refuse them
        raise DataError(f"{path}: not a plain numeric array ({e}); ragged rows belong in "
                        f"Parquet or JSON Lines") from None
    if a.ndim not in ndims:
        raise DataError(f"{path}: an array of shape {a.shape}; expected " + (
            "[rows] (labels)" if ndims == (1,) else "[rows, length] or [rows, length, channels]"))
    return a


def _read_npz(path, columns):
    try:
        z = np.load(path, allow_pickle=False)
    except ValueError as e:
        raise DataError(f"{path}: not a plain numeric archive ({e})") from None
    present = list(z.files)
    t = _InMemory(path, columns, {}, 0)
    t._check_columns(present)
    t._data = {role: z[name] for role, name in columns.items()}
    if t._data["inputs"].ndim not in (2, 3):
        raise DataError(f"{path}: column {columns['inputs']!r} has shape "
                        f"{t._data['inputs'].shape}; expected [rows, length(, channels)]")
    t.num_rows = len(t._data["inputs"])
    if "label" in t._data and len(t._data["label"]) != t.num_rows:
        raise DataError(f"{path}: column {columns['label']!r} has {len(t._data['label'])} "
                        f"rows, column {columns['inputs']!r} {t.num_rows}; every row needs "
                        f"its label")
    return t


def open_table(path, fmt, columns, cache_size=2):
    """The `Table` of one split file; `columns` {role: name}, roles inputs and (optional)
    label."""
    path = str(path)
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    fmt = detect_format(path, fmt)
    if fmt == "jsonl":
        return _read_jsonl(path, columns)
    if fmt in ("csv", "tsv"):
        return _read_csv(path, columns, "\t" if fmt == "tsv" else ",")
    if fmt == "parquet":
        return ParquetTable(path, columns, cache_size)
    if fmt == "npy":
        return NpyTable(path, columns)
    return _read_npz(path, columns)
