"""Causal language modelling data: an offline code corpus, a byte tokeniser, packed windows.

The corpus (`task='code_lm'`) is the Python source of installed packages, a GitHub-like code set
that exists on every machine without a download (the GSS paper's GitHub set, in miniature):

  1. for each name in `data.lm.packages` (import names, e.g. 'jax'), every `*.py` file under the
     package's folder, as `<name>/<relative path>`; the list is sorted;
  2. the files are ordered by SHA-256 of that path and each is taken if it still fits in
     `data.lm.max_bytes` (so the budget samples every package, not the first alphabetically);
  3. each file goes to train / validation / test by another hash of its path (`split_of`), so a
     file is never split and the assignment does not move when the budget or package list changes;
  4. a file that is not UTF-8 or holds a NUL byte is skipped and counted (`skipped` in the
     manifest); an empty result is a `DataError` naming the packages.

The manifest (`build_corpus(...).manifest`, or `python -m sptlib.data.lm --manifest`) lists the
package versions, every file with its size, sha256 and split, the skip counts, and a `checksum`
over (path, split, content hash): two machines with the same pins get the same checksum.

Tokens: bytes, id = byte + 2 (`<pad>`=0, `<mask>`=1 as everywhere, `sptlib.vocab`) and one
end-of-file id `EOF_ID` = 258 after each file: vocabulary 259. Bits per token therefore equal bits
per byte up to the end-of-file tokens (one per file, ~0.02% of tokens here).

Windows (`WindowSource`): the split's token stream is cut into consecutive, non-overlapping
windows of `length` tokens (the tail shorter than a window is dropped and counted). Training
shuffles the windows (grain); evaluation reads them in order and may use a longer `length` on
the same text (`limit_tokens`: only the first so many tokens, so every length sees the same text).

Paper corpora (`task='pg19' | 'lm1b' | 'arxiv'`): the TFDS builders `pg19`, `lm1b` and
`scientific_papers/arxiv` (arXiv articles: the paper's arXiv Math set is not public), read with
`tfds.data_source` (ArrayRecord, no TensorFlow at read time) and tokenised with a SentencePiece
model (`data.lm.spm_model`, the `sentencepiece` package: `pip install sptlib[lm]`) or bytes when
none is given. Both imports are lazy: nothing here needs them on CPU or in tests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os

import ml_collections
import numpy as np

from sptlib import vocab
from sptlib.data import sources
from sptlib.data.errors import DataError

EOF_ID = vocab.NUM_SPECIAL + 256  # end of file, after the 256 byte ids
BYTE_LM_VOCAB_SIZE = EOF_ID + 1
LM_TASKS = ("code_lm", "pg19", "lm1b", "arxiv")
DEFAULT_LENGTH = 512  # tokens per window when data.max_length is 0
# The sptlib dependencies: installed wherever sptlib is, at the versions its pins give.
DEFAULT_PACKAGES = ("absl", "etils", "flax", "grain", "jax", "ml_collections", "optax", "orbax")


def lm_config() -> ml_collections.ConfigDict:
    """`config.data.lm`: corpus and window options of the causal LM tasks."""
    c = ml_collections.ConfigDict()
    # code_lm: import names of the packages whose *.py files form the corpus.
    c.packages = DEFAULT_PACKAGES
    # code_lm: byte budget of the whole corpus (files taken in hash order until it is reached).
    c.max_bytes = 4_000_000
    # code_lm: percent of files (by path hash) in validation and in test.
    c.validation_percent = 5
    c.test_percent = 5
    # Validation/test: use only the first this many tokens of the split (0 = all), so that
    # evaluations at several window lengths read the same text.
    c.eval_tokens = 0
    # pg19 / lm1b: SentencePiece model file ('' = byte tokens); needs `sentencepiece`.
    c.spm_model = ""
    return c


# ---------------------------------------------------------------------------------------------
# The offline code corpus.


def _hash_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def split_of(path: str, validation_percent: int, test_percent: int) -> str:
    """The split of a corpus file, from a hash of its path only."""
    bucket = _hash_int("split:" + path) % 100
    if bucket < test_percent:
        return "test"
    if bucket < test_percent + validation_percent:
        return "validation"
    return "train"


def package_dir(name: str) -> str:
    """The folder of installed package `name` (found without importing it)."""
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise DataError(f"data.lm.packages: {name!r} is not an installed package (no folder "
                        "found by importlib.util.find_spec)")
    return sorted(locations)[0]


def list_files(roots: dict[str, str]) -> list[tuple[str, str]]:
    """`[(corpus path '<name>/<rel>', file path)]` of every *.py under each root, sorted."""
    out = []
    for name, root in sorted(roots.items()):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for f in sorted(filenames):
                if f.endswith(".py"):
                    full = os.path.join(dirpath, f)
                    out.append((f"{name}/{os.path.relpath(full, root)}", full))
    return sorted(out)


def _versions(names) -> dict[str, str]:
    dists = importlib.metadata.packages_distributions()
    out = {}
    for n in names:
        for d in sorted(dists.get(n, [])):
            try:
                out[d] = importlib.metadata.version(d)
            except importlib.metadata.PackageNotFoundError:
                pass
    return out


@dataclasses.dataclass
class Corpus:
    """Token streams per split (int32 ids) and the manifest that describes them."""

    streams: dict
    manifest: dict


def read_text_file(path, skipped):
    """The bytes of a UTF-8 text file, or None (counted in `skipped["binary"]` for a NUL byte,
    `skipped["undecodable"]` for invalid UTF-8): the sources' readers skip those files."""
    with open(path, "rb") as fh:
        content = fh.read()
    if b"\x00" in content:
        skipped["binary"] += 1
        return None
    try:
        content.decode("utf-8")
    except UnicodeDecodeError:
        skipped["undecodable"] += 1
        return None
    return content

def build_corpus(packages=DEFAULT_PACKAGES, max_bytes=4_000_000, validation_percent=5,
                 test_percent=5, roots: dict[str, str] | None = None) -> Corpus:
    """Builds the code corpus (see the module docstring).

    Args:
      packages: import names; `roots` (name -> folder) replaces the lookup (tests).
      max_bytes: byte budget of all splits together.
      validation_percent, test_percent: percent of files per held-out split.

    Raises:
      DataError: a package is not installed, or no file could be read.
    """
    roots = dict(roots) if roots is not None else {p: package_dir(p) for p in packages}
    files = sorted(list_files(roots), key=lambda f: (_hash_int(f[0]), f[0]))
    chunks = {"train": [], "validation": [], "test": []}
    entries, skipped, total = [], {"undecodable": 0, "binary": 0, "over_budget": 0}, 0
    for path, full in files:
        content = read_text_file(full, skipped)
        if content is None:
            continue
        if total + len(content) > max_bytes:
            skipped["over_budget"] += 1
            continue
        total += len(content)
        split = split_of(path, validation_percent, test_percent)
        ids = np.frombuffer(content, np.uint8).astype(np.int32) + vocab.NUM_SPECIAL
        chunks[split] += [ids, np.asarray([EOF_ID], np.int32)]
        entries.append({"path": path, "bytes": len(content), "split": split,
                        "sha256": hashlib.sha256(content).hexdigest()})
    if not entries:
        raise DataError(f"code_lm corpus is empty: no readable *.py file within max_bytes="
                        f"{max_bytes} under packages {sorted(roots)} (skipped: {skipped})")
    entries.sort(key=lambda e: e["path"])
    digest = hashlib.sha256()
    for e in entries:
        digest.update(f"{e['path']}\t{e['split']}\t{e['sha256']}\n".encode())
    streams = {s: (np.concatenate(c) if c else np.zeros(0, np.int32)) for s, c in chunks.items()}
    manifest = {
        "packages": sorted(roots), "versions": _versions(sorted(roots)), "max_bytes": max_bytes,
        "validation_percent": validation_percent, "test_percent": test_percent,
        "num_files": len(entries), "bytes": total, "skipped": skipped,
        "tokens": {s: int(len(v)) for s, v in streams.items()},
        "checksum": digest.hexdigest(), "files": entries}
    return Corpus(streams, manifest)


_CACHE: dict = {}


def corpus_for(cfg) -> Corpus:
    """`build_corpus` for `config.data.lm`, built once per process."""
    if not cfg.packages:
        raise DataError("data.lm.packages is empty: name the installed packages whose *.py "
                        "files form the code_lm corpus (e.g. --config.data.lm.packages=jax,numpy)")
    key = (tuple(cfg.packages), int(cfg.max_bytes), int(cfg.validation_percent),
           int(cfg.test_percent))
    if key not in _CACHE:
        _CACHE[key] = build_corpus(*key)
        m = _CACHE[key].manifest
        logging.info("code_lm corpus: %d files, %d bytes, checksum %s, skipped %s",
                     m["num_files"], m["bytes"], m["checksum"][:16], m["skipped"])
    return _CACHE[key]


# ---------------------------------------------------------------------------------------------
# Packed windows.


class WindowSource:
    """Consecutive non-overlapping windows of a token stream (a grain random-access source).

    Window i is `stream[i * length:(i + 1) * length]`, all positions real (`mask` True). With
    `limit_tokens` only the first so many tokens are used. `num_dropped` tokens at the end (less
    than a window) are not read.
    """

    def __init__(self, stream, length: int, limit_tokens: int = 0):
        if length < 2:
            raise ValueError(f"window length must be >= 2 (one prediction), got {length}")
        stream = np.asarray(stream, np.int32)
        if limit_tokens:
            stream = stream[:limit_tokens]
        self.length = int(length)
        self.num_windows = len(stream) // self.length
        self.num_dropped = len(stream) - self.num_windows * self.length
        self.num_truncated = 0
        self._stream = stream
        if self.num_windows == 0:
            raise DataError(f"token stream of {len(stream)} tokens holds no window of length "
                            f"{length}: raise data.lm.max_bytes / eval_tokens or shorten the window")

    def __len__(self):
        return self.num_windows

    def __getitem__(self, i):
        i = int(i)
        if not 0 <= i < self.num_windows:
            raise IndexError(f"window {i} outside [0, {self.num_windows})")
        ids = self._stream[i * self.length:(i + 1) * self.length]
        return {"inputs": ids.copy(), "mask": np.ones(self.length, bool),
                "label": np.int32(0), "example_mask": np.bool_(True)}

    def filler(self):
        return {"inputs": np.zeros(self.length, np.int32), "mask": np.zeros(self.length, bool),
                "label": np.int32(0), "example_mask": np.bool_(False)}


# ---------------------------------------------------------------------------------------------
# Paper corpora through TFDS (lazy imports; pod runs only).


def tfds_stream(task: str, split: str, cfg, max_tokens: int = 0) -> np.ndarray:
    """Token stream of TFDS `pg19`, `lm1b` or `scientific_papers/arxiv` (fields `book_text`,
    `text`, `article`), documents
    separated by `EOF_ID` (bytes) or the SentencePiece model's EOS id."""
    tfds = sources.import_tfds(f"config.data.task={task!r}")  # pod runs only
    name, field = {"pg19": ("pg19", "book_text"), "lm1b": ("lm1b", "text"),
                   "arxiv": ("scientific_papers/arxiv", "article")}[task]
    # lm1b has no validation split: its test split doubles as validation (as LRA Text does).
    tfds_split = "test" if (task == "lm1b" and split == "validation") else split
    records = tfds.data_source(name, split=tfds_split,
                               data_dir=cfg.tfds_data_dir or None)
    encode, eos = _text_encoder(cfg.lm.spm_model)
    out, n = [], 0
    for i in range(len(records)):
        ids = encode(records[i][field])
        out += [ids, np.asarray([eos], np.int32)]
        n += len(ids) + 1
        if max_tokens and n >= max_tokens:
            break
    return np.concatenate(out)


def _text_encoder(spm_model: str):
    """(encode(text or bytes) -> int32 ids, eos id)."""
    if not spm_model:
        def encode_bytes(text):
            text = text.encode("utf-8") if isinstance(text, str) else bytes(text)
            return np.frombuffer(text, np.uint8).astype(np.int32) + vocab.NUM_SPECIAL
        return encode_bytes, EOF_ID
    import sentencepiece as spm  # lazy: `pip install sptlib[lm]`
    sp = spm.SentencePieceProcessor(model_file=spm_model)

    def encode_spm(text):
        text = text.decode("utf-8") if isinstance(text, bytes) else text
        # SentencePiece ids shifted past <pad>/<mask>, so the reserved ids keep their meaning.
        return np.asarray(sp.encode(text), np.int32) + vocab.NUM_SPECIAL
    return encode_spm, sp.eos_id() + vocab.NUM_SPECIAL


def vocab_size(cfg) -> int:
    """Vocabulary of an LM task's tokens (bytes: 259)."""
    if cfg.task != "code_lm" and cfg.lm.spm_model:
        import sentencepiece as spm  # lazy
        return spm.SentencePieceProcessor(model_file=cfg.lm.spm_model).vocab_size() + \
            vocab.NUM_SPECIAL
    return BYTE_LM_VOCAB_SIZE


def main(argv=None):
    """`python -m sptlib.data.lm --manifest out.json [--max_bytes N]`: writes the manifest."""
    import argparse
    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--manifest", required=True)
    p.add_argument("--max_bytes", type=int, default=4_000_000)
    p.add_argument("--packages", default=",".join(DEFAULT_PACKAGES))
    a = p.parse_args(argv)
    corpus = build_corpus(tuple(a.packages.split(",")), a.max_bytes)
    with open(a.manifest, "w") as fh:
        json.dump(corpus.manifest, fh, indent=1)
    m = corpus.manifest
    print(f"{m['num_files']} files, {m['bytes']} bytes, tokens {m['tokens']}, skipped "
          f"{m['skipped']}, checksum {m['checksum']}")


if __name__ == "__main__":
    main()
