"""Sequential Fashion-MNIST from the Debian package `dataset-fashion-mnist`.

Files (gzipped or not) in `/usr/share/datasets/fashion-mnist/`: `train-images-idx3-ubyte`,
`train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`. The last 10% of
the training set (6,000 images) is the validation split; test is the 10k test set (or its first
`config.data.test_examples`). Images are 784-long pixel sequences (row-major); resolution 14
average-pools 2x2 blocks (196 long). Decoded splits are cached per process, so a comparison that
runs many cells in one process reads and pools the files once.
"""

import functools
import gzip
import os
import struct

import numpy as np

from sptlib.data import sources
from sptlib.data.defaults import resolution as task_resolution, task_info
from sptlib.data.errors import DataError
from sptlib.data.registry import Task, register

INSTALL_HINT = ("install it with `sudo apt-get install dataset-fashion-mnist` (Debian/Ubuntu) "
                "or set config.data.fashion_mnist_dir to a folder with the idx files")
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
VALIDATION_FRACTION = 0.1


def _open(folder, name):
    for candidate in (name, name + ".gz"):
        path = os.path.join(folder, candidate)
        if os.path.exists(path):
            opener = gzip.open if candidate.endswith(".gz") else open
            with opener(path, "rb") as f:
                return path, f.read()
    raise DataError(f"Fashion-MNIST file {os.path.join(folder, name)}[.gz] not found: "
                    f"{INSTALL_HINT}.")


def read_idx(path, data, expected_magic):
    """Parses an idx file's bytes -> uint8 array ([n] labels or [n, rows, cols] images)."""
    if len(data) < 8:
        raise DataError(f"{path}: truncated idx header")
    magic, n = struct.unpack(">II", data[:8])
    if magic != expected_magic:
        raise DataError(f"{path}: bad idx magic number {magic}, expected {expected_magic}")
    if magic == 2051:
        rows, cols = struct.unpack(">II", data[8:16])
        shape, offset = (n, rows, cols), 16
    else:
        shape, offset = (n,), 8
    size = int(np.prod(shape))
    if len(data) - offset != size:
        raise DataError(f"{path}: expected {size} bytes of data, found {len(data) - offset}")
    return np.frombuffer(data, np.uint8, offset=offset).reshape(shape)


def load(folder, split, resolution=28):
    """Returns (uint8 images [n, resolution, resolution], int32 labels [n]) of a split (read-only
    arrays, cached per process: copy before writing)."""
    return _load(os.path.abspath(folder), split, int(resolution), _signature(folder))


def _signature(folder):
    """(name, size, mtime) of the folder's files: a changed file is read again, not cached."""
    try:
        return tuple((e.name, e.stat().st_size, e.stat().st_mtime_ns)
                     for e in sorted(os.scandir(folder), key=lambda e: e.name))
    except OSError:
        return ()


@functools.lru_cache(maxsize=8)
def _load(folder, split, resolution, signature):
    del signature  # only part of the cache key
    if not os.path.isdir(folder):
        raise DataError(f"Fashion-MNIST folder {folder} not found: {INSTALL_HINT}.")
    part = "test" if split == "test" else "train"
    ipath, idata = _open(folder, FILES[part][0])
    lpath, ldata = _open(folder, FILES[part][1])
    images = read_idx(ipath, idata, 2051)
    labels = read_idx(lpath, ldata, 2049).astype(np.int32)
    if len(images) != len(labels):
        raise DataError(f"{ipath}: {len(images)} images but {lpath} has {len(labels)} labels")
    if labels.size and labels.max() > 9:
        raise DataError(f"{lpath}: label {labels.max()} outside 0..9")
    if part == "train":
        cut = len(images) - int(round(VALIDATION_FRACTION * len(images)))
        sl = slice(0, cut) if split == "train" else slice(cut, None)
        images, labels = images[sl], labels[sl]
    if resolution != images.shape[1]:
        f = images.shape[1] // resolution
        if f * resolution != images.shape[1]:
            raise ValueError(f"resolution {resolution} does not divide {images.shape[1]}")
        pooled = images.reshape(len(images), resolution, f, resolution, f).mean(axis=(2, 4))
        images = np.round(pooled).astype(np.uint8)
    images, labels = np.ascontiguousarray(images), np.ascontiguousarray(labels)
    images.flags.writeable = labels.flags.writeable = False
    return images, labels


# ---------------------------------------------------------------------------------------------
# The task


@register("fashion_mnist")
def build(cfg):
    """The `fashion_mnist` Task: the Debian package's idx files (784 or 196 long)."""
    res = task_resolution(cfg)

    def read(split):
        images, labels = load(cfg.fashion_mnist_dir, split, res)
        limit = int(cfg.get("test_examples", 0) or 0)
        if split == "test" and limit:
            images, labels = images[:limit], labels[:limit]
        return sources.ArraySource(images.reshape(len(images), -1, 1), labels, cfg.input_type)

    # Fail early, with the install hint, if the files are missing.
    if not os.path.isdir(cfg.fashion_mnist_dir):
        load(cfg.fashion_mnist_dir, "test", res)
    return Task(cfg, task_info(cfg), read)
