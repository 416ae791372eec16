"""LRA Image (CIFAR-10 greyscale, 1024 long) and sCIFAR (RGB) from TFDS `cifar10`.

Train is the first 45k training images, validation the last 5k, test the test set.
"""

import numpy as np

from sptlib.data import sources
from sptlib.data.defaults import CIFAR_LENGTH, task_info
from sptlib.data.registry import Task, register

SPLITS = {"train": "train[:45000]", "validation": "train[45000:]", "test": "test"}


def greyscale(rgb):
    """ITU-R 601 luma as in tf.image.rgb_to_grayscale, rounded to uint8: [..., 3] -> [...]."""
    y = rgb.astype(np.float32) @ np.asarray([0.2989, 0.5870, 0.1140], np.float32)
    return np.clip(np.round(y), 0, 255).astype(np.uint8)


def build_cifar(cfg, rgb):
    """The `image` (greyscale) or `scifar` (RGB) Task."""
    channels = 3 if rgb else 1

    def decode(rec):
        img = np.asarray(rec["image"])
        values = img.reshape(-1, 3) if rgb else greyscale(img).reshape(-1, 1)
        ex = sources.encode_values(values, cfg.input_type)
        ex["label"] = np.int32(rec["label"])
        return ex

    def filler():
        ex = sources.filler_values(cfg.input_type, CIFAR_LENGTH, channels)
        ex["label"] = np.int32(0)
        return ex

    load = lambda split: sources.MappedSource(  # noqa: E731
        sources.tfds_source("cifar10", SPLITS[split], cfg), decode, filler)
    return Task(cfg, task_info(cfg), load)


register("image")(lambda cfg: build_cifar(cfg, rgb=False))
register("scifar")(lambda cfg: build_cifar(cfg, rgb=True))
