"""What every task builder uses: `Task` and `register` (its `info` is `defaults.task_info`).

A task's builder registers itself with `@register(name)`, beside its reader (e.g. `build` in
`fashion_mnist.py`) or, for the tasks with a TFDS copy, in `file_tasks.py`;
`sptlib.data.get_task` (in `catalog.py`) imports every builder module and dispatches on
`config.data.task`.
"""

import logging

import numpy as np

from sptlib.data import pipeline
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


def missing_lra_error(lra_dir, expected, task, generate_cmd=None):
    """The error for a missing LRA folder: what was expected and how to get it."""
    msg = (f"{task}: expected {expected} under lra_dir={lra_dir!r}, not found. Get the LRA release "
           f"({LRA_URL}, extract it and set config.data.lra_dir to the folder that holds "
           f"listops-1000/, tsv_data/, pathfinder32/ ...)")
    if generate_cmd:
        msg += f", or generate it: `{generate_cmd}` (or set config.data.generate.enabled=True)"
    return DataError(msg + ".")


def check_tokens(cfg, name):
    """Text-like tasks read token ids only."""
    if cfg.input_type != "tokens":
        raise ValueError(f"{name} supports input_type='tokens' only, got {cfg.input_type!r}")


BUILDERS = {}  # task name -> build(cfg) -> Task; filled by `register`


def register(*names):
    """Decorator: registers `build(cfg) -> Task` as the builder of each task in `names`."""
    def deco(fn):
        for name in names:
            BUILDERS[name] = fn
        return fn
    return deco
