"""Random-access example sources: tokenised sequences, document pairs, images, audio.

Each source turns stored examples into the batch contract of docs/architecture.md (one example,
padded to the task's fixed length): `inputs`, `mask`, `label`, `example_mask` (+ `raw` for
continuous inputs, `inputs2`/`mask2` for pairs; per-position labelling tasks carry `targets`
instead of `label`). `filler()` gives the all-padding example used to
complete the last evaluation batch. Sources are picklable (grain worker processes).
"""

import numpy as np

from sptlib import errors
from sptlib.data import tokenizers


def pad_tokens(ids, length):
    """int ids [n] (n <= length) -> (int32 [length] padded with 0, bool mask [length])."""
    out = np.zeros(length, np.int32)
    mask = np.zeros(length, bool)
    out[:len(ids)] = ids
    mask[:len(ids)] = True
    return out, mask


class _Packed:
    """Variable-length sequences stored as one flat array + offsets (compact, picklable).

    Values are stored as given (uint8 by default: ListOps ids, raw bytes); `id_offset` is added
    on access (e.g. 2 turns raw bytes into byte-level ids).
    """

    def __init__(self, seqs, max_length, dtype=np.uint8, id_offset=0):
        self.id_offset = id_offset
        lengths = np.asarray([len(s) for s in seqs], dtype=np.int64)
        self.num_truncated = int(np.sum(lengths > max_length))
        lengths = np.minimum(lengths, max_length)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.flat = np.zeros(int(self.offsets[-1]), dtype)
        for i, s in enumerate(seqs):
            self.flat[self.offsets[i]:self.offsets[i + 1]] = s[:lengths[i]]

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        return self.flat[self.offsets[i]:self.offsets[i + 1]].astype(np.int32) + self.id_offset


class TokenSource:
    """Token sequences with labels; sequences longer than `max_length` are truncated (counted)."""

    def __init__(self, seqs, labels, max_length, id_offset=0):
        self.max_length = max_length
        self._seqs = _Packed(seqs, max_length, id_offset=id_offset)
        self.labels = np.asarray(labels, np.int32)
        self.num_truncated = self._seqs.num_truncated
        assert len(self._seqs) == len(self.labels)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        inputs, mask = pad_tokens(self._seqs[i], self.max_length)
        return {"inputs": inputs, "mask": mask, "label": self.labels[i],
                "example_mask": np.bool_(True)}

    def filler(self):
        return {"inputs": np.zeros(self.max_length, np.int32),
                "mask": np.zeros(self.max_length, bool), "label": np.int32(0),
                "example_mask": np.bool_(False)}


class PairTokenSource:
    """Pairs of token sequences (retrieval) with labels, each document padded to `max_length`."""

    def __init__(self, seqs1, seqs2, labels, max_length, id_offset=0):
        self.max_length = max_length
        self._a = _Packed(seqs1, max_length, id_offset=id_offset)
        self._b = _Packed(seqs2, max_length, id_offset=id_offset)
        self.labels = np.asarray(labels, np.int32)
        self.num_truncated = self._a.num_truncated + self._b.num_truncated

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        a, ma = pad_tokens(self._a[i], self.max_length)
        b, mb = pad_tokens(self._b[i], self.max_length)
        return {"inputs": a, "mask": ma, "inputs2": b, "mask2": mb, "label": self.labels[i],
                "example_mask": np.bool_(True)}

    def filler(self):
        z = np.zeros(self.max_length, np.int32)
        m = np.zeros(self.max_length, bool)
        return {"inputs": z, "mask": m, "inputs2": z, "mask2": m, "label": np.int32(0),
                "example_mask": np.bool_(False)}


class PositionSource:
    """Full-length token sequences with a class per position: int ids, int targets (class or
    -1 = not scored) and bool mask, each `[n, length]` (the synthetic probes)."""

    def __init__(self, inputs, targets, mask):
        self.inputs = np.asarray(inputs, np.int32)
        self.targets = np.asarray(targets, np.int32)
        self.mask = np.asarray(mask, bool)
        assert self.inputs.shape == self.targets.shape == self.mask.shape
        self.num_truncated = 0

    def __len__(self):
        return len(self.inputs)

    def __getitem__(self, i):
        return {"inputs": self.inputs[i], "mask": self.mask[i], "targets": self.targets[i],
                "example_mask": np.bool_(True)}

    def filler(self):
        n = self.inputs.shape[1]
        return {"inputs": np.zeros(n, np.int32), "mask": np.zeros(n, bool),
                "targets": np.full(n, -1, np.int32), "example_mask": np.bool_(False)}


def encode_values(values, input_type, length=None):
    """8-bit values [n, channels] -> the model inputs of one example.

    tokens: `inputs` int32 [n * channels] (channels interleaved), ids value + 2.
    continuous: `inputs` float32 [n, channels] in [-1, 1] and `raw` int32 [n, channels].
    Sequences shorter than `length` are padded (mask False); longer ones are cut.
    """
    values = np.asarray(values)
    if values.ndim == 1:
        values = values[:, None]
    if input_type == "tokens":
        ids = tokenizers.pixel_tokens(values.reshape(-1))
        n = len(ids) if length is None else length
        inputs, mask = pad_tokens(ids[:n], n)
        return {"inputs": inputs, "mask": mask}
    n = values.shape[0] if length is None else length
    c = values.shape[1]
    real = min(values.shape[0], n)
    inputs = np.zeros((n, c), np.float32)
    raw = np.zeros((n, c), np.int32)
    inputs[:real] = tokenizers.normalise_pixels(values[:real])
    raw[:real] = values[:real]
    mask = np.zeros(n, bool)
    mask[:real] = True
    return {"inputs": inputs, "mask": mask, "raw": raw}


def filler_values(input_type, length, channels):
    """The all-padding example matching `encode_values(..., length)`."""
    if input_type == "tokens":
        return {"inputs": np.zeros(length * channels, np.int32),
                "mask": np.zeros(length * channels, bool)}
    return {"inputs": np.zeros((length, channels), np.float32),
            "mask": np.zeros(length, bool), "raw": np.zeros((length, channels), np.int32)}


class ArraySource:
    """In-memory 8-bit values `[n, length, channels]` (images, pixel sequences) with labels."""

    def __init__(self, values, labels, input_type):
        values = np.asarray(values, np.uint8)
        self.values = values.reshape(values.shape[0], -1, values.shape[-1]) \
            if values.ndim > 2 else values[..., None]
        self.labels = np.asarray(labels, np.int32)
        self.input_type = input_type
        self.num_truncated = 0

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        ex = encode_values(self.values[i], self.input_type)
        ex.update(label=self.labels[i], example_mask=np.bool_(True))
        return ex

    def filler(self):
        ex = filler_values(self.input_type, self.values.shape[1], self.values.shape[2])
        ex.update(label=np.int32(0), example_mask=np.bool_(False))
        return ex


class MappedSource:
    """Wraps a random-access record source (e.g. `tfds.data_source`) with a decode function.

    `decode(record) -> (values [n, channels] uint8-range ints, label)` or, for token tasks,
    `decode(record) -> example dict` when `raw_examples=True`.
    """

    def __init__(self, records, decode, filler, indices=None):
        self._records = records
        self._decode = decode
        self._filler = filler
        self._indices = indices
        self.num_truncated = 0

    def __len__(self):
        return len(self._records) if self._indices is None else len(self._indices)

    def __getitem__(self, i):
        j = i if self._indices is None else int(self._indices[i])
        ex = self._decode(self._records[j])
        ex["example_mask"] = np.bool_(True)
        return ex

    def filler(self):
        return self._filler()


TFDS_EXTRA = ("install sptlib's tfds extra: pip install -e '.[tfds]' in a clone, "
              "pip install 'sptlib-<version>-py3-none-any.whl[tfds]' from a wheel")


def import_tfds(what: str):
    """`tensorflow_datasets`, or a one-line `ConfigError` saying which extra installs it: TFDS
    and TensorFlow are not in the core install (training needs neither)."""
    try:
        import tensorflow_datasets as tfds  # deferred: TFDS (and TensorFlow) only for `what`
    except ImportError as e:
        raise errors.ConfigError(
            f"{what} needs TensorFlow Datasets, which the core install leaves out; "
            f"{TFDS_EXTRA} ({type(e).__name__}: {e})") from None
    return tfds


def tfds_source(name, split, cfg):
    """A prepared TFDS dataset's split with random access (`tfds.data_source`, ArrayRecord)."""
    tfds = import_tfds(f"config.data.task={cfg.task!r} (TFDS dataset {name!r})")
    kwargs = {"data_dir": cfg.tfds_data_dir} if cfg.tfds_data_dir else {}
    try:
        return tfds.data_source(name, split=split, download=False, **kwargs)
    except Exception as e:
        raise RuntimeError(
            f"TFDS dataset {name!r} (split {split!r}) is not prepared in ArrayRecord format under "
            f"{cfg.tfds_data_dir or 'the default TFDS data dir'}; prepare it once with "
            f"`tfds build {name} --file_format=array_record"
            f"{' --data_dir=' + cfg.tfds_data_dir if cfg.tfds_data_dir else ''}` "
            f"({type(e).__name__}: {e})") from e
