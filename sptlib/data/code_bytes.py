"""Byte-level source-code classification (`task='code_bytes'`): which package a window is from.

An LRA-Text-like long-range task that exists offline on every machine: the Python sources of
installed packages (the corpus of `sptlib.data.lm`, here labelled by package).

  1. For each name in `data.code_bytes.packages` (import names; the class id is its position in
     that list), every `*.py` file under the installed package's folder (or under
     `data.code_bytes.root/<name>/` when `root` is set), listed as `<name>/<relative path>`.
  2. A file that holds a NUL byte or is not UTF-8 is skipped. Its first `header_lines` lines (the
     license header, the module docstring's start) and every import line (`import x`,
     `from x import y`, which name packages) are removed, so the answer is not in the first bytes.
  3. What remains is cut into consecutive windows of `data.code_bytes.window` bytes (0, the
     default: `data.max_length`, itself 2,048 by default); the shorter tail is dropped, and at most `max_windows_per_file` windows are kept per file
     (spread evenly over it), so a few large files cannot make up a class.
  4. Whole files go to the splits, so no file is in two: per package, the files in the order of
     a hash of their path go to test until it holds `test_percent` of the package's windows,
     then to validation until it holds `validation_percent`, the rest to train (stratified, so a
     package with few files still has held-out windows). Then each split is balanced: every
     class keeps as many windows as the smallest class of that split has (chosen by a hash of
     path and window index).
  5. The model reads the first `data.max_length` bytes of each window (all of it by default; a
     shorter `max_length` with `window=2048` gives the same examples with less context).
  6. `data.test_examples` > 0 keeps only that many test windows (in their hash order, so the
     classes stay balanced in expectation).

Tokens are bytes, id = byte + 2 (`<pad>`=0, `<mask>`=1), vocabulary 258, as for LRA Text; every
window is full, so there is no padding. `build_windows(...).manifest` lists the packages, their
versions, per split and class the window counts, and a checksum over (path, split, window
counts): two machines with the same package versions get the same task.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import os
import re

import numpy as np

from sptlib import vocab
from sptlib.data import lm, sources
from sptlib.data.defaults import sequence_length, task_info
from sptlib.data.errors import DataError
from sptlib.data.registry import SPLITS, Task, check_tokens, register

# Ten packages with over 1 MB of Python each, installed with sptlib (its dependencies and the
# packaging tools of every virtual environment).
DEFAULT_PACKAGES = ("flax", "grain", "jax", "matplotlib", "numpy", "optax", "orbax", "pip",
                    "scipy", "setuptools")
_IMPORT = re.compile(rb"^[ \t]*(import|from)[ \t].*$", re.MULTILINE)


def strip_source(content: bytes, header_lines: int) -> bytes:
    """The file without its first `header_lines` lines and without import lines."""
    body = b"".join(content.splitlines(keepends=True)[header_lines:])
    lines = body.splitlines(keepends=True)
    return b"".join(line for line in lines if not _IMPORT.match(line))


def windows_of(body: bytes, length: int, max_windows: int) -> list[tuple[int, bytes]]:
    """`[(index, window)]`: consecutive `length`-byte windows, at most `max_windows` of them,
    evenly spaced over the file when there are more."""
    n = len(body) // length
    picks = range(n) if n <= max_windows else np.linspace(0, n - 1, max_windows).round()
    return [(int(i), body[int(i) * length:(int(i) + 1) * length]) for i in picks]


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def package_roots(cfg) -> dict[str, str]:
    """`{import name: folder}` of `cfg.packages` (`cfg` = `config.data.code_bytes`)."""
    if len(cfg.packages) < 2:
        raise DataError("data.code_bytes.packages must name at least two packages (the classes), "
                        f"got {tuple(cfg.packages)}")
    if cfg.root:
        roots = {p: os.path.join(cfg.root, p) for p in cfg.packages}
        missing = [p for p, d in roots.items() if not os.path.isdir(d)]
        if missing:
            raise DataError(f"code_bytes: package folders {missing} not found under "
                            f"data.code_bytes.root={cfg.root!r} (expected <root>/<package>/)")
        return roots
    roots = {}
    for p in cfg.packages:
        try:
            roots[p] = lm.package_dir(p)
        except DataError:
            raise DataError(f"code_bytes: package {p!r} is not installed (looked it up with "
                            f"importlib.util.find_spec from {os.getcwd()}): install it (`pip "
                            f"install {p}`), drop it from data.code_bytes.packages, or set "
                            "data.code_bytes.root to a folder with one sub-folder per "
                            "package") from None
    return roots


@dataclasses.dataclass
class Windows:
    """Per split: uint8 windows [n, length] and int32 labels [n]; the manifest."""

    windows: dict
    labels: dict
    manifest: dict


def build_windows(packages, length, *, header_lines=20, max_windows_per_file=16,
                  validation_percent=15, test_percent=15, roots=None) -> Windows:
    """Builds the task's splits (see the module docstring). `roots`: name -> folder."""
    packages = tuple(packages)
    files = lm.list_files(roots)
    found = collections.Counter(f[0].split("/", 1)[0] for f in files)
    empty = [p for p in packages if not found.get(p)]
    if empty:
        raise DataError(f"code_bytes: no *.py file under {[roots[p] for p in empty]} "
                        f"(packages {empty})")
    per = {s: {c: [] for c in range(len(packages))} for s in SPLITS}
    skipped = {"binary": 0, "undecodable": 0, "short": 0}
    by_package = {p: [] for p in packages}
    for path, full in files:
        if path.split("/", 1)[0] not in by_package:
            continue
        content = lm.read_text_file(full, skipped)
        if content is None:
            continue
        ws = windows_of(strip_source(content, header_lines), length, max_windows_per_file)
        if not ws:
            skipped["short"] += 1
            continue
        by_package[path.split("/", 1)[0]].append((_hash("split:" + path), path, ws))
    file_splits = {}
    for label, p in enumerate(packages):
        total = sum(len(ws) for _, _, ws in by_package[p])
        taken = {"test": 0, "validation": 0}
        for _, path, ws in sorted(by_package[p]):
            if taken["test"] < test_percent * total / 100:
                split = "test"
            elif taken["validation"] < validation_percent * total / 100:
                split = "validation"
            else:
                split = "train"
            taken[split] = taken.get(split, 0) + len(ws)
            file_splits[path] = (split, len(ws))
            per[split][label] += [(_hash(f"{path}#{i}"), w) for i, w in ws]
    out_w, out_l, counts = {}, {}, {}
    for split in SPLITS:
        n = min(len(v) for v in per[split].values())
        if n == 0:
            short = [packages[c] for c, v in per[split].items() if not v]
            raise DataError(f"code_bytes: split {split!r} has no {length}-byte window of "
                            f"packages {short}; use shorter windows (data.max_length) or other "
                            "packages")
        chosen = [(h, c, w) for c, v in per[split].items() for h, w in sorted(v)[:n]]
        chosen.sort(key=lambda t: t[0])  # mixed classes, deterministic order
        out_w[split] = np.frombuffer(b"".join(w for _, _, w in chosen), np.uint8).reshape(
            len(chosen), length)
        out_l[split] = np.asarray([c for _, c, _ in chosen], np.int32)
        counts[split] = {"per_class": n, "available": {packages[c]: len(v)
                                                       for c, v in per[split].items()}}
    digest = hashlib.sha256()
    for path in sorted(file_splits):
        digest.update(f"{path}\t{file_splits[path][0]}\t{file_splits[path][1]}\n".encode())
    manifest = {"packages": list(packages), "versions": lm._versions(packages),
                "length": length, "header_lines": header_lines,
                "max_windows_per_file": max_windows_per_file,
                "validation_percent": validation_percent, "test_percent": test_percent,
                "files": len(file_splits), "skipped": skipped, "windows": counts,
                "checksum": digest.hexdigest()}
    return Windows(out_w, out_l, manifest)


@functools.lru_cache(maxsize=4)
def _cached(packages, length, header_lines, max_windows, vp, tp, roots_items) -> Windows:
    return build_windows(packages, length, header_lines=header_lines,
                         max_windows_per_file=max_windows, validation_percent=vp,
                         test_percent=tp, roots=dict(roots_items))


def windows_for(cfg) -> Windows:
    """`build_windows` for `config.data` (built once per process)."""
    cb = cfg.code_bytes
    roots = package_roots(cb)
    return _cached(tuple(cb.packages), int(cb.window) or sequence_length(cfg),
                   int(cb.header_lines),
                   int(cb.max_windows_per_file), int(cb.validation_percent),
                   int(cb.test_percent), tuple(sorted(roots.items())))


@register("code_bytes")
def build(cfg):
    """The `code_bytes` Task (windows of `data.max_length` bytes, default 2,048)."""
    check_tokens(cfg, "code_bytes")
    w = windows_for(cfg)  # fails here, naming the package, when the sources are missing
    length = sequence_length(cfg)

    def read(split):
        x, y = w.windows[split][:, :length], w.labels[split]
        limit = int(cfg.get("test_examples", 0) or 0)
        if split == "test" and limit:
            x, y = x[:limit], y[:limit]
        return sources.TokenSource(list(x), y, length, id_offset=vocab.NUM_SPECIAL)

    info = task_info(cfg)
    info["checksum"] = w.manifest["checksum"]
    return Task(cfg, info, read)
