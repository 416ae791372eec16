"""The generated orientation images of the `lines` task: which way does the line (or stripe) run?

A CPU-sized image task for the local reproduction (docs/reproducing.md). Each R x R grey image
(default 16 x 16, read as an L = R*R pixel sequence) holds background noise, isolated dots and
one straight segment of `min_len`..`max_len` pixels; the label is the segment's direction:
0 horizontal, 1 vertical, 2 diagonal (down-right), 3 anti-diagonal (down-left).

Why this task: dots and segment pixels share one intensity distribution and the number of dots
varies, so no per-pixel statistic (mean, histogram, pooled pixel features) says anything about
the label. The model has to relate a lit pixel to its neighbours at sequence offsets 1, R-1, R
and R+1 — the 2-D locality an SSM's convolution kernel expresses directly and a Transformer
with absolute positions must learn from data. Masked-pixel denoising on the same images rewards
exactly those relations (a masked segment pixel is predictable from its segment neighbours), so
self-pretraining has something to teach.

Pure NumPy; `generate(n, seed=...)` is deterministic and byte-identical across runs. Image i is
drawn from its own stream seeded [seed, i], so a set's first images do not depend on its size.
"""

import logging

import numpy as np

from sptlib.data import sources
from sptlib.data.defaults import resolution as task_resolution, task_info
from sptlib.data.release import check_count
from sptlib.data.registry import Task, register
from sptlib.errors import ConfigError

NUM_CLASSES = 4
CLASS_NAMES = ("horizontal", "vertical", "diagonal", "anti-diagonal")
# (row step, column step) of each direction.
_STEPS = ((0, 1), (1, 0), (1, 1), (1, -1))
# Stream tag of held-out (validation/test) images: never used for a training image.
HELD_OUT_TAG = 1_000_003


def draw_sample(rng, resolution, label, *, min_len=4, max_len=7, min_dots=4, max_dots=10,
                noise=0.25):
    """One image: uint8 `[resolution, resolution]`.

    Background uniform in [0, noise]; the segment and the dots uniform in [0.6, 1.0]. No dot
    touches (8-neighbourhood) the segment or another dot, so dots never extend or form lines.
    """
    r = resolution
    if not 0 <= label < NUM_CLASSES:
        raise ValueError(f"label must be in [0, {NUM_CLASSES}), got {label}")
    if max_len > r:
        raise ValueError(f"max_len={max_len} does not fit a {r} x {r} image")
    img = rng.uniform(0.0, noise, size=(r, r))
    taken = np.zeros((r + 2, r + 2), bool)  # padded occupancy (8-neighbourhood checks)
    length = int(rng.integers(min_len, max_len + 1))
    dr, dc = _STEPS[label]
    # Start so that every pixel of the segment is inside the image.
    rows = range(0, r - dr * (length - 1))
    cols = range(max(0, -dc * (length - 1)), r - max(0, dc) * (length - 1))
    r0, c0 = int(rng.choice(rows)), int(rng.choice(cols))
    for k in range(length):
        y, x = r0 + dr * k, c0 + dc * k
        img[y, x] = rng.uniform(0.6, 1.0)
        taken[y:y + 3, x:x + 3] = True
    dots = int(rng.integers(min_dots, max_dots + 1))
    placed, tries = 0, 0
    while placed < dots and tries < 50 * dots:
        tries += 1
        y, x = (int(v) for v in rng.integers(0, r, size=2))
        if taken[y + 1, x + 1]:
            continue
        img[y, x] = rng.uniform(0.6, 1.0)
        taken[y:y + 3, x:x + 3] = True
        placed += 1
    return np.round(img * 255).astype(np.uint8)


def draw_grating(rng, resolution, label, *, min_period=3.0, max_period=6.0, noise=0.25):
    """One striped image: uint8 `[resolution, resolution]` whose stripes run in direction
    `label` (same classes as `draw_sample`).

    intensity = 0.5 + (c / 2) sin(2 pi d / period + phase) + N(0, (noise / 2)^2), clipped to
    [0, 1], with d the distance across the stripes, period uniform in [min_period, max_period)
    pixels, phase uniform, contrast c uniform in [0.5, 1). Every pixel is predictable from its
    neighbours along the stripes, so masked denoising has a dense signal; the histogram of
    intensities is the same for every direction, so only pixel relations carry the label.
    """
    if not 0 <= label < NUM_CLASSES:
        raise ValueError(f"label must be in [0, {NUM_CLASSES}), got {label}")
    y, x = np.mgrid[0:resolution, 0:resolution].astype(np.float64)
    dr, dc = _STEPS[label]
    # Distance across the stripes: the coordinate along the normal of the stripe direction.
    d = (x * dr - y * dc) / np.hypot(dr, dc)
    period = rng.uniform(min_period, max_period)
    phase = rng.uniform(0, 2 * np.pi)
    contrast = rng.uniform(0.5, 1.0)
    img = 0.5 + 0.5 * contrast * np.sin(2 * np.pi * d / period + phase)
    img = np.clip(img + rng.normal(0.0, noise / 2, img.shape), 0.0, 1.0)
    return np.round(img * 255).astype(np.uint8)


STYLES = {"segments": draw_sample, "gratings": draw_grating}


def generate(num, *, resolution=16, seed=0, held_out=False, style="segments", **kwargs):
    """`num` images and labels: (uint8 `[num, resolution, resolution]`, int32 `[num]`).

    Labels cycle through the classes (balanced to within one). `held_out=True` draws from a
    stream no training set uses (seeded [seed, HELD_OUT_TAG, i]), for validation and test.
    style: segments (`draw_sample`) | gratings (`draw_grating`).
    """
    if style not in STYLES:
        raise ConfigError(f"style must be one of {sorted(STYLES)}, got {style!r}")
    num = check_count("num", num, 0)
    check_count("resolution", resolution, 2)
    draw = STYLES[style]
    images = np.empty((num, resolution, resolution), np.uint8)
    labels = np.arange(num, dtype=np.int32) % NUM_CLASSES
    for i in range(num):
        key = [seed, HELD_OUT_TAG, i] if held_out else [seed, i]
        images[i] = draw(np.random.default_rng(key), resolution, int(labels[i]), **kwargs)
    return images, labels


def split(num_train, num_val, num_test, *, resolution=16, seed=0, **kwargs):
    """{'train', 'validation', 'test'} -> (images, labels). Validation and test are the first
    `num_val` and the next `num_test` images of one held-out draw (balanced when each count is
    a multiple of NUM_CLASSES)."""
    train = generate(num_train, resolution=resolution, seed=seed, **kwargs)
    ev_images, ev_labels = generate(num_val + num_test, resolution=resolution, seed=seed,
                                    held_out=True, **kwargs)
    return {"train": train,
            "validation": (ev_images[:num_val], ev_labels[:num_val]),
            "test": (ev_images[num_val:], ev_labels[num_val:])}


# ---------------------------------------------------------------------------------------------
# The task (generated in memory)


@register("lines")
def build(cfg):
    """The `lines` Task: images drawn in memory on first use (one draw for all three splits)."""
    res = task_resolution(cfg)
    if res < 8:
        raise ValueError(f"lines: resolution must be >= 8, got {res}")
    if int(cfg.max_length) and int(cfg.max_length) != res * res:
        raise ValueError(f"lines: max_length is fixed at {res * res} (resolution {res})")
    gen = cfg.generate
    state = {}

    def load(split_name):
        if "splits" not in state:  # one draw for all three splits (train vs held-out streams)
            logging.info("Lines: generating %d/%d/%d images at %d px (seed %d)", gen.num_train,
                         gen.num_val, gen.num_test, res, gen.seed)
            state["splits"] = split(int(gen.num_train), int(gen.num_val), int(gen.num_test),
                                    resolution=res, seed=int(gen.seed), noise=float(gen.noise),
                                    style=str(gen.style))
        images, labels = state["splits"][split_name]
        return sources.ArraySource(images.reshape(len(images), -1, 1), labels, cfg.input_type)

    return Task(cfg, task_info(cfg), load)
