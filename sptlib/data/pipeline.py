"""Grain pipelines over random-access sources: sharding, shuffling, batching, eval padding.

A *source* is any object with `__len__` and `__getitem__(i) -> dict of NumPy arrays` of fixed
shapes (one example, already tokenised and padded, with `example_mask=True`), plus `filler()`
returning an all-padding example with `example_mask=False`.

Order of operations (all on grain `MapDataset`s, so every step is random access and the iterator
state is a position that grain saves and restores exactly):
  split indices -> [nested data-fraction subset] -> this process's shard (i::count, disjoint and
  covering) -> [train: shuffle by seed, a fresh permutation each epoch] -> repeat(num_epochs)
  -> [drop_remainder=False: pad with filler ids to a whole number of batches, the same number on
  every shard] -> read examples -> batch.
"""

import math
import sys

import grain
import numpy as np


def nested_subset(num_examples, fraction, seed):
    """Sorted indices of a `fraction` of range(num_examples), nested across fractions.

    The subset is the first ceil(fraction * n) entries of a fixed-seed permutation, so for the same
    seed 1% is contained in 5% which is contained in 100%.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"data_fraction must be in (0, 1], got {fraction}")
    if fraction == 1.0:
        return np.arange(num_examples, dtype=np.int64)
    perm = np.random.default_rng(seed).permutation(num_examples)
    k = max(1, math.ceil(fraction * num_examples))
    return np.sort(perm[:k])


def shard_indices(indices, shard_index, shard_count):
    """This shard's part of `indices`: every shard_count-th, from shard_index (disjoint, covering)."""
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index {shard_index} outside [0, {shard_count})")
    return np.asarray(indices)[shard_index::shard_count]


class _PadTo(grain.MapDataset):
    """Extends a finite dataset of ids to `length` with the filler id -1."""

    def __init__(self, parent, length):
        super().__init__(parent)
        self._length = length

    def __len__(self):
        return self._length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        return self._parent[index] if index < len(self._parent) else -1

    def __str__(self):
        return f"_PadTo(length={self._length})"


class _Lookup(grain.transforms.Map):
    """id -> example dict (id -1 -> the source's filler example)."""

    def __init__(self, source):
        self._source = source

    def map(self, index):
        index = int(index)
        return self._source.filler() if index < 0 else self._source[index]


def make_iterator(source, *, batch_size, seed, shuffle, indices=None, shard_index=0,
                  shard_count=1, num_epochs=None, drop_remainder=True, num_workers=0,
                  read_threads=4, prefetch_buffer_size=64):
    """Returns a grain `DatasetIterator` of batches (dicts of arrays with a leading [batch] axis).

    Args:
      source: random-access source of examples (see module docstring).
      batch_size: examples per batch on this process.
      seed: shuffling seed (train); the same seed gives the same order.
      shuffle: reshuffle every epoch (train) or keep file order (evaluation).
      indices: the split's example ids to use (e.g. a data-fraction subset); default all.
      shard_index, shard_count: this process's shard.
      num_epochs: passes over the data; None = forever.
      drop_remainder: drop the last partial batch; if False the last batch is completed with
        filler examples (`example_mask=False`), and every shard yields the same number of batches.
    """
    if indices is None:
        indices = np.arange(len(source), dtype=np.int64)
    total = len(indices)
    ids = shard_indices(indices, shard_index, shard_count)
    if len(ids) == 0 and drop_remainder:
        raise ValueError(f"shard {shard_index}/{shard_count} of {total} examples is empty")
    ds = grain.MapDataset.source(ids)
    if shuffle:
        ds = ds.shuffle(seed=seed)
    ds = ds.repeat(num_epochs)
    if not drop_remainder:
        if num_epochs is None:
            raise ValueError("drop_remainder=False needs a finite num_epochs")
        # Same number of batches on every shard, so multi-process evaluation stays in lock-step.
        per_shard = math.ceil(total / shard_count) * num_epochs
        ds = _PadTo(ds, math.ceil(per_shard / batch_size) * batch_size)
    ds = ds.map(_Lookup(source))
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=read_threads,
                                              prefetch_buffer_size=prefetch_buffer_size))
    it = it.batch(batch_size, drop_remainder=drop_remainder)
    if num_workers > 0:
        _ensure_absl_flags_parsed()
        it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers))
    return iter(it)


def _ensure_absl_flags_parsed():
    """grain's worker processes read absl flags; outside `absl.app.run` parse the defaults."""
    from absl import flags
    if not flags.FLAGS.is_parsed():
        flags.FLAGS(sys.argv[:1], known_only=True)
