"""The user's own dataset, no code: `config.data.task = "files"` (docs/your_data.md).

Train / validation / test files (`config.data.files`) in JSON Lines, CSV/TSV, Parquet or NumPy
(`sptlib.data.user_readers`); each example is token ids, a text string (bytes, characters, or a
SentencePiece model) or a float array `[length, channels]`, with a label column (integers, or
strings mapped to classes in sorted order) or none (pretraining-only data).

`infer(config.data)` reads every split once (memoised in the process by the files' size and
modification time) and returns the data spec: input kind, vocabulary, classes, maximum length,
channels and normalisation, split sizes, and the held-out rows carved from train when the
validation (or test) file is not given. Any bad value stops it with one line naming the file, row
and column. `record_spec(config.data, workdir)` writes it to `<workdir>/data_spec.json` and, on a
resumed run, checks that the data still give the same model (`MODEL_KEYS`).

Examples longer than `max_length` are truncated and counted (`Task.num_truncated`, logged, and
in the spec). Nothing here imports JAX: `task_info` calls `infer` for the FLOP estimates and
compiles that must not touch grain.
"""

from __future__ import annotations

import json
import logging
import math
import os

import ml_collections
import numpy as np

from sptlib import vocab
from sptlib.data import user_columns as cols
from sptlib.data.user_readers import open_table
from sptlib.data.user_sources import CHAR_UNK, Encoder, FileSource
from sptlib.errors import DataError

SPEC_FILE = "data_spec.json"
SPLITS = ("train", "validation", "test")
# Spec fields a checkpoint depends on: a change on resume means another model.
MODEL_KEYS = ("kind", "vocab_size", "classes", "num_classes", "max_length", "channels", "chars",
              "mean", "std", "holdout")
_MEMO: dict = {}


def files_config():
    """`config.data.files`: the user's files (docs/your_data.md)."""
    c = ml_collections.ConfigDict()
    # Split files. validation / test '' = carved from train (`holdout_fraction` each).
    c.train = ""
    c.validation = ""
    c.test = ""
    # auto (from the extension) | jsonl | csv | tsv | parquet | npy | npz.
    c.format = "auto"
    # Column of the examples, and of the labels ('' = no labels: pretraining-only data).
    # .npy: labels live in `<stem>.<label_column>.npy` beside the inputs.
    c.input_column = "inputs"
    c.label_column = "label"
    # auto (from the train file's first value) | tokens (integer ids) | text | floats
    # ([length] or [length, channels] real numbers).
    c.kind = "auto"
    # Text: bytes (UTF-8, 256 ids) | chars (the train file's characters, sorted) | a
    # SentencePiece model file (needs `sentencepiece`: pip install sptlib[lm]).
    c.text_vocab = "bytes"
    # Token ids: the vocabulary size (ids 0..vocab_size-1); 0 = the largest id seen + 1.
    c.vocab_size = 0
    # Classes of integer labels (0..num_classes-1); 0 = the largest label seen + 1.
    c.num_classes = 0
    # Rows of train held out for each missing split (fraction of train, rounded up), by seed.
    c.holdout_fraction = 0.1
    c.holdout_seed = 0
    # Parquet row groups kept decoded per source (random access reads one on demand).
    c.row_group_cache = 2
    return c


def _paths(cfg):
    f = cfg.files
    if not str(f.train).strip():
        raise DataError("config.data.files.train is empty: give the training file (e.g. "
                        "--config=experiments/files.py:train=data/train.parquet, or "
                        "--config.data.files.train=data/train.parquet)")
    return {s: os.path.abspath(str(f[s])) if str(f[s]).strip() else "" for s in SPLITS}


def _columns(f):
    out = {"inputs": str(f.input_column)}
    if str(f.label_column):
        out["label"] = str(f.label_column)
    return out


def _open(cfg, path, key):
    try:
        return open_table(path, cfg.files.format, _columns(cfg.files),
                          int(cfg.files.row_group_cache))
    except DataError as e:
        if not os.path.exists(path):
            raise DataError(f"config.data.files.{key}={path}: no such file") from None
        raise e


def _memo_key(cfg, paths):
    stats = {s: (p, os.stat(p).st_size, os.stat(p).st_mtime_ns) if p and os.path.exists(p)
             else (p,) for s, p in paths.items()}
    return json.dumps([cfg.files.to_dict(), int(cfg.max_length), stats], sort_keys=True,
                      default=str)


def infer(cfg) -> dict:
    """The data spec of `cfg` (`config.data`, task "files"): see the module docstring."""
    paths = _paths(cfg)
    key = _memo_key(cfg, paths)
    if key not in _MEMO:
        _MEMO.clear()  # one dataset per process at a time; keeps the memo small
        _MEMO[key] = _infer(cfg, paths)
    return _MEMO[key]


def _first_values(table):
    for _, chunk in table.chunks():
        return chunk
    return None


def _infer(cfg, paths) -> dict:
    f = cfg.files
    tables = {s: _open(cfg, p, s) for s, p in paths.items() if p}
    for s, t in tables.items():
        if t.num_rows == 0:
            raise DataError(f"{t.path}: the {s} split holds no rows (an empty or header-only "
                            f"file?)")
    first = _first_values(tables["train"])
    kind = str(f.kind)
    if kind == "auto":
        kind = cols.infer_kind(first["inputs"])
    if kind not in cols.KINDS:
        raise DataError(f"config.data.files.kind={kind!r}: expected auto or one of "
                        f"{', '.join(cols.KINDS)}")
    labelled = "label" in tables["train"].columns
    int_labels = labelled and cols.is_int_labels(first["label"])
    # Integers written as text ("1", "2" in a CSV) name the classes that occur (ordered by
    # value), not class ids 0..max: no phantom class that no row has. A declared num_classes
    # keeps them ids.
    named_ints = int_labels and not int(f.num_classes) and cols.text_cells(first["label"])
    text_vocab = str(f.text_vocab)
    if kind == "text" and text_vocab not in ("bytes", "chars") and not os.path.isfile(text_vocab):
        raise DataError(f"config.data.files.text_vocab={text_vocab!r}: expected bytes, chars or "
                        f"a SentencePiece model file (not found)")
    chars = None
    if kind == "text" and text_vocab == "chars":
        seen = set()
        for start, chunk in tables["train"].chunks():
            for s in cols.texts(chunk["inputs"], cols.Where(tables["train"], "inputs", start)):
                seen.update(s)
        chars = "".join(sorted(seen))
    enc = Encoder(kind, text_vocab, chars)
    declared_vocab, declared_classes = int(f.vocab_size), int(f.num_classes)
    stats = dict(lengths={}, max_id=-1, classes=set(), max_label=-1, channels=None,
                 seen=set(), named_ints=named_ints)
    sums = None
    for split, t in tables.items():
        lengths = []
        for start, chunk in t.chunks():
            flat, offsets = enc.inputs(chunk["inputs"], cols.Where(t, "inputs", start))
            lengths.append(np.diff(offsets))
            if not lengths[-1].all():  # nothing to mix, pool or mask: refused, not padded
                raise cols.Where(t, "inputs", start)(int(np.argmin(lengths[-1])),
                                                      "empty example (no positions)")
            if kind == "tokens" and len(flat):
                _check_ids(flat, offsets, declared_vocab, cols.Where(t, "inputs", start))
                stats["max_id"] = max(stats["max_id"], int(flat.max()))
            if kind == "floats":
                c = flat.shape[1]
                if stats["channels"] is None:
                    stats["channels"] = c
                elif c != stats["channels"]:
                    raise cols.Where(t, "inputs", start)(
                        0, f"{c} channels; earlier rows have {stats['channels']}")
                if split == "train" and len(flat):
                    part = (flat.sum(0), (flat ** 2).sum(0), len(flat), flat.min(0), flat.max(0))
                    sums = part if sums is None else (
                        sums[0] + part[0], sums[1] + part[1], sums[2] + part[2],
                        np.minimum(sums[3], part[3]), np.maximum(sums[4], part[4]))
            if labelled:
                where = cols.Where(t, "label", start)
                lab = cols.labels(chunk["label"], where, int_labels)
                _check_labels(lab, split, stats, int_labels, declared_classes, where)
        stats["lengths"][split] = np.concatenate(lengths)
    if labelled:
        _check_two_classes(tables["train"], stats, int_labels)
    return _spec(cfg, paths, tables, kind, text_vocab, chars, labelled, int_labels, stats, sums)


# The largest token id a batch holds: ids are shifted past the reserved ones into int32.
MAX_TOKEN_ID = int(np.iinfo(np.int32).max) - vocab.NUM_SPECIAL


def _check_ids(flat, offsets, declared, where):
    if declared > MAX_TOKEN_ID + 1:
        raise DataError(f"config.data.files.vocab_size={declared}: at most {MAX_TOKEN_ID + 1} "
                        f"(ids are int32 past the reserved ones)")
    bad = np.flatnonzero((flat < 0) | ((flat >= declared) if declared else (flat > MAX_TOKEN_ID)))
    if len(bad):
        p = int(bad[0])
        row = int(np.searchsorted(offsets, p, side="right")) - 1
        limit = f"0..{declared - 1} (config.data.files.vocab_size={declared})" if declared \
            else f"0..{MAX_TOKEN_ID} (ids index an embedding table: number them 0..vocab-1)"
        raise where(row, f"token id {int(flat[p])} at position {p - offsets[row]} outside the "
                         f"vocabulary {limit}")


def _check_labels(lab, split, stats, int_labels, declared, where):
    if int_labels:
        bad = np.flatnonzero((lab < 0) | ((lab >= declared) if declared else False))
        if len(bad):
            limit = f"0..{declared - 1} (config.data.files.num_classes)" if declared else ">= 0"
            raise where(int(bad[0]), f"label {int(lab[bad[0]])} outside {limit}")
        if stats["named_ints"] and split != "train":
            unknown = [i for i, v in enumerate(lab.tolist()) if v not in stats["seen"]]
            if unknown:
                raise where(unknown[0], f"label {int(lab[unknown[0]])} is not a class of the "
                                        f"train file ({len(stats['seen'])} classes)")
        if len(lab):
            stats["max_label"] = max(stats["max_label"], int(lab.max()))
            if split == "train":
                stats["seen"].update(int(v) for v in np.unique(lab))
    elif split == "train":
        stats["classes"].update(lab.tolist())
    else:
        unknown = [i for i, v in enumerate(lab.tolist()) if v not in stats["classes"]]
        if unknown:
            raise where(unknown[0], f"label {lab[unknown[0]]!r} is not a class of the train "
                                    f"file ({len(stats['classes'])} classes)")


def _check_two_classes(train, stats, int_labels):
    """A classifier needs two classes: a label column with one value would score 100% for any
    model (refused, not warned: set label_column='' for data without labels)."""
    seen = stats["seen"] if int_labels else stats["classes"]
    if len(seen) < 2:
        what = f"a single class ({next(iter(seen))!r})" if seen else "no class"
        raise DataError(f"{train.path}: column {train.columns['label']!r} holds {what} in all "
                        f"{train.num_rows} rows; a classifier needs at least two (any model "
                        f"would score 100%). Give the other classes, or set "
                        f"config.data.files.label_column='' for data without labels")


def _spec(cfg, paths, tables, kind, text_vocab, chars, labelled, int_labels, stats, sums):
    f = cfg.files
    lengths = stats["lengths"]
    max_length = int(cfg.max_length) or int(lengths["train"].max(initial=1))
    max_length = max(max_length, 1)
    spec = dict(kind=kind, input_column=str(f.input_column),
                label_column=str(f.label_column) if labelled else "", text_vocab=None,
                chars=chars, max_length=max_length, channels=1)
    if kind == "tokens":
        spec["vocab_size"] = vocab.NUM_SPECIAL + (int(f.vocab_size) or stats["max_id"] + 1)
    elif kind == "text":
        spec["text_vocab"] = text_vocab
        if text_vocab == "bytes":
            spec["vocab_size"] = vocab.NUM_SPECIAL + 256
        elif text_vocab == "chars":
            spec["vocab_size"] = CHAR_UNK + 1 + len(chars)
        else:
            import sentencepiece as spm  # optional: pip install sptlib[lm]
            size = spm.SentencePieceProcessor(model_file=text_vocab).vocab_size()
            spec["vocab_size"] = vocab.NUM_SPECIAL + size
    else:
        s, s2, n, lo, hi = sums
        mean = s / n
        std = np.sqrt(np.maximum(s2 / n - mean ** 2, 0.0))
        spec.update(vocab_size=0, channels=int(stats["channels"]),
                    mean=[float(x) for x in mean],
                    std=[float(x) if x > 1e-12 else 1.0 for x in std],
                    min=[float(x) for x in lo], max=[float(x) for x in hi])
    if not labelled:
        spec.update(classes=None, num_classes=0)
    elif stats["named_ints"]:
        classes = [str(v) for v in sorted(stats["seen"])]
        spec.update(classes=classes, num_classes=len(classes))
    elif int_labels:
        spec.update(classes=None, num_classes=int(f.num_classes) or stats["max_label"] + 1)
    else:
        spec.update(classes=sorted(stats["classes"]), num_classes=len(stats["classes"]))
    n_train = tables["train"].num_rows
    carved = [s for s in ("validation", "test") if not paths[s]]
    k = math.ceil(float(f.holdout_fraction) * n_train) if carved else 0
    if carved and (k < 1 or k * len(carved) >= n_train):
        raise DataError(f"{tables['train'].path}: {n_train} rows cannot give {k} held-out "
                        f"rows for each of {', '.join(carved)} (config.data.files."
                        f"holdout_fraction={f.holdout_fraction}); give the split files")
    spec["holdout"] = dict(splits=carved, rows_each=k, fraction=float(f.holdout_fraction),
                           seed=int(f.holdout_seed), train_file_rows=n_train) if carved else None
    rows = holdout_rows(spec["holdout"])
    splits = {}
    for s in SPLITS:
        src = "train" if s in carved else s
        ids = rows[s] if src == "train" else None
        n = len(ids) if ids is not None else tables[s].num_rows
        lens = lengths[src] if ids is None else lengths[src][ids]
        splits[s] = dict(path=paths[src], rows=int(n), carved_from_train=s in carved,
                         longest=int(lens.max(initial=0)),
                         truncated=int(np.sum(lens > max_length)))
    spec["splits"] = splits
    spec["files"] = {s: dict(path=p, bytes=os.stat(p).st_size) for s, p in paths.items() if p}
    return spec


def holdout_rows(holdout):
    """{split: sorted train-file row ids} of train and each carved split (None: the split's
    own file): a permutation of the train file's rows by `holdout.seed`, cut in order."""
    out = {"train": None, "validation": None, "test": None}
    if not holdout:
        return out
    perm = np.random.default_rng(int(holdout["seed"])).permutation(
        int(holdout["train_file_rows"]))
    k = int(holdout["rows_each"])
    for i, s in enumerate(holdout["splits"]):
        out[s] = np.sort(perm[i * k:(i + 1) * k])
    out["train"] = np.sort(perm[k * len(holdout["splits"]):])
    return out


def info(spec) -> dict:
    """`Task.info` of a spec (`sptlib.data.defaults.info` fields, plus the masked target)."""
    floats = spec["kind"] == "floats"
    out = dict(name="files", vocab_size=int(spec["vocab_size"]),
               num_classes=int(spec["num_classes"]), max_length=int(spec["max_length"]),
               input_type="continuous" if floats else "tokens",
               d_input=int(spec["channels"]), pair=False)
    if floats:
        out["masked_target"] = "l1"  # real-valued features: L1 on the normalised inputs
    return out


def task_info(cfg) -> dict:
    return info(infer(cfg))


def load_split(cfg, spec, split):
    """The random-access source of `split` (carved rows of train where the spec says so)."""
    s = spec["splits"][split]
    key = "train" if s["carved_from_train"] else split
    table = _open(cfg, s["path"], key)
    rows = holdout_rows(spec["holdout"])[split]
    return FileSource(table, spec, rows, s["truncated"])


def record_spec(cfg, workdir, write=True) -> dict:
    """Writes the spec to `<workdir>/data_spec.json`, or checks it against the one there (a
    resumed run): a change in `MODEL_KEYS` is a `DataError` naming the field; other changes
    (paths, file sizes) are logged."""
    from etils import epath  # deferred: only the trainer's preflight records specs
    spec = infer(cfg)
    path = epath.Path(workdir) / SPEC_FILE
    if "://" not in str(path) and os.path.islink(path):
        raise DataError(f"{path} is a symbolic link (to {os.readlink(path)}), not the spec a run "
                        f"wrote: not read through; remove the link to record the data anew")
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise DataError(f"{path}: unreadable (truncated?); move it aside to record the "
                            f"data anew") from None
        for k in MODEL_KEYS:
            if old.get(k) != spec.get(k):
                raise DataError(
                    f"{path}: the data changed since this workdir was made: {k} = "
                    f"{_short(old.get(k))} there, {_short(spec.get(k))} now (from "
                    f"{spec['files']['train']['path']}); its checkpoints belong to the old data. "
                    f"Use a new --workdir, or restore the files.")
        if old.get("files") != spec.get("files"):
            logging.warning("%s: the data files moved or changed size (%s -> %s) but give the "
                            "same model; going on.", path, old.get("files"), spec.get("files"))
        return spec
    if write:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_replacing(str(path), json.dumps(spec, indent=1, sort_keys=True).encode())
    return spec


def _write_replacing(path, data: bytes) -> None:
    """`data` into `path` as the trainer's safe writer does (`sptlib.train.results`, which this
    layer may not import): a temporary file of a fresh name beside it (never a fixed name that
    could be planted as a symlink), then `os.replace`, which replaces a link at `path` instead of
    writing through it. gs://...: one write."""
    if "://" in path:
        from etils import epath
        epath.Path(path).write_bytes(data)
        return
    import tempfile
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _short(v):
    text = json.dumps(v)
    return text if len(text) <= 60 else text[:57] + "..."
