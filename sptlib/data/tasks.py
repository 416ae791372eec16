"""`get_task(config.data) -> Task`: one entry point for every task (docs/architecture.md, "Data").

Task defaults (LRA / the SPT paper):
  listops          tokens, 10 classes, 2000 long          <lra_dir>/listops-1000/
  text             bytes, 2 classes, 4096                  TFDS imdb_reviews (test = validation)
  retrieval        bytes, pairs, 2 classes, 4000 per doc   <lra_dir>/tsv_data/
  image            CIFAR-10 greyscale, 1024                TFDS cifar10 (train 45k / val 5k)
  scifar           CIFAR-10 RGB, 1024 x 3                  TFDS cifar10
  pathfinder       32 x 32 = 1024, 2 classes              <lra_dir>/pathfinder32/<difficulty>/
  pathx / pathx256 128 x 128 = 16384 / 256 x 256 = 65536   <lra_dir>/pathfinder{128,256}/
  speech_commands  raw 16 kHz audio, 16000, 35 classes     <speech_commands_dir>/ (SC35, v0.02)
  fashion_mnist    784 (or 196 at resolution 14), 10       /usr/share/datasets/fashion-mnist/
  lines            R x R (default 16 x 16), 4 classes      generated in memory (sptlib/data/lines.py)
  code_lm          causal LM, bytes, windows of 512        Python source of installed packages
  pg19 / lm1b      causal LM (SentencePiece or bytes)      TFDS pg19 / lm1b (sptlib/data/lm.py)
"""

import logging
import os

import numpy as np

from sptlib.data import listops, pipeline, sources, tokenizers
from sptlib.data.config import TASKS
from sptlib.data.errors import DataError

SPLITS = ("train", "validation", "test")
LRA_URL = "https://storage.googleapis.com/long-range-arena/lra_release.gz"


class Task:
    """A task: its `info` and per-split random-access sources behind `make_iterator`.

    Attributes:
      info: dict with vocab_size (incl. reserved ids; 0 for continuous), num_classes, max_length,
        input_type, d_input, pair (+ name).
      num_truncated: dict split -> examples truncated at max_length (filled as splits load).
    """

    def __init__(self, cfg, info, load_split):
        self.cfg = cfg
        self.info = info
        self._load_split = load_split
        self._sources = {}
        self.num_truncated = {}

    def source(self, split):
        """The split's random-access source (loaded once)."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        if split not in self._sources:
            src = self._load_split(split)
            self._sources[split] = src
            self.num_truncated[split] = int(getattr(src, "num_truncated", 0))
            if self.num_truncated[split]:
                logging.warning("%s/%s: %d of %d examples truncated at max_length %d",
                                self.info["name"], split, self.num_truncated[split], len(src),
                                self.info["max_length"])
        return self._sources[split]

    def split_indices(self, split):
        """Example ids of a split: the nested data-fraction subset for train, all otherwise."""
        n = len(self.source(split))
        if split == "train":
            return pipeline.nested_subset(n, float(self.cfg.data_fraction),
                                          int(self.cfg.data_fraction_seed))
        return np.arange(n, dtype=np.int64)

    def num_examples(self, split):
        return len(self.split_indices(split))

    def make_iterator(self, split, *, batch_size, seed, shard_index=0, shard_count=1,
                      num_epochs=None, drop_remainder=True):
        """Iterator of batches (dicts of NumPy arrays) with grain's get_state()/set_state().

        Train is reshuffled each epoch from `seed`; validation/test keep file order. With
        drop_remainder=False the last batch is completed with `example_mask=False` fillers.
        """
        return pipeline.make_iterator(
            self.source(split), batch_size=batch_size, seed=seed, shuffle=(split == "train"),
            indices=self.split_indices(split), shard_index=shard_index, shard_count=shard_count,
            num_epochs=num_epochs, drop_remainder=drop_remainder,
            num_workers=int(self.cfg.num_workers), read_threads=int(self.cfg.read_threads),
            prefetch_buffer_size=int(self.cfg.prefetch_buffer_size))


def _info(name, *, vocab_size, num_classes, max_length, input_type, d_input=1, pair=False):
    return dict(name=name, vocab_size=vocab_size, num_classes=num_classes, max_length=max_length,
                input_type=input_type, d_input=d_input, pair=pair)


def missing_lra_error(lra_dir, expected, task, generate_cmd=None):
    """The error for a missing LRA folder: what was expected and how to get it."""
    msg = (f"{task}: expected {expected} under lra_dir={lra_dir!r}, not found. Get the LRA release "
           f"({LRA_URL}, extract it and set config.data.lra_dir to the folder that holds "
           f"listops-1000/, tsv_data/, pathfinder32/ ...)")
    if generate_cmd:
        msg += f", or generate it: `{generate_cmd}` (or set config.data.generate.enabled=True)"
    return DataError(msg + ".")


def _check_tokens(cfg, name):
    if cfg.input_type != "tokens":
        raise ValueError(f"{name} supports input_type='tokens' only, got {cfg.input_type!r}")


# ---------------------------------------------------------------------------------------------
# ListOps


def _listops(cfg):
    _check_tokens(cfg, "listops")
    max_length = int(cfg.max_length) or 2000
    gen = cfg.generate
    if not os.path.exists(listops.split_path(cfg.lra_dir, "train")):
        if gen.enabled:
            logging.info("ListOps: generating %d/%d/%d examples in %s", gen.num_train,
                         gen.num_val, gen.num_test, cfg.lra_dir)
            listops.generate_release(cfg.lra_dir, num_train=gen.num_train, num_val=gen.num_val,
                                     num_test=gen.num_test, seed=gen.seed,
                                     min_length=gen.min_length, max_length=gen.max_length)
        else:
            raise missing_lra_error(
                cfg.lra_dir, f"{listops.FOLDER}/basic_train.tsv", "listops",
                f"python -m sptlib.data listops --out {cfg.lra_dir} --num_train 96000 "
                f"--num_val 2000 --num_test 2000 --seed 0")

    if cfg.source == "tfds":
        from sptlib.data import lra_tfds
        load = lambda split: lra_tfds.listops_source(cfg, split, max_length)  # noqa: E731
    else:
        def load(split):
            seqs, labels = listops.read_split(listops.split_path(cfg.lra_dir, split))
            return sources.TokenSource(seqs, labels, max_length)

    info = _info("listops", vocab_size=tokenizers.LISTOPS_VOCAB_SIZE, num_classes=10,
                 max_length=max_length, input_type="tokens")
    return Task(cfg, info, load)


_BUILDERS = {"listops": _listops}


def register(name):
    def deco(fn):
        _BUILDERS[name] = fn
        return fn
    return deco


def get_task(cfg):
    """Builds the Task for `cfg.task` (a `data_config()`)."""
    if cfg.task not in TASKS:
        raise ValueError(f"unknown task {cfg.task!r}; expected one of {TASKS}")
    if cfg.input_type not in ("tokens", "continuous"):
        raise ValueError(f"input_type must be tokens|continuous, got {cfg.input_type!r}")
    if cfg.source not in ("files", "tfds"):
        raise ValueError(f"source must be files|tfds, got {cfg.source!r}")
    # Importing these registers their builders.
    from sptlib.data import task_more  # noqa: F401
    from sptlib.data import lm_task  # noqa: F401  (code_lm, pg19, lm1b)
    return _BUILDERS[cfg.task](cfg)
