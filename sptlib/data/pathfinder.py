"""Pathfinder / PathX: a generator of the release format and its reader.

Release layout (`<lra_dir>/pathfinder{R}/<difficulty>/`):
  imgs/<b>/sample_<i>.png     single-channel R x R PNGs
  metadata/<b>.npy            *plain text* despite the name, one line per image:
                              `imgs/<b> sample_<i>.png <i> <label> ...` (extra fields ignored)
Difficulties: curv_baseline (contour length 6), curv_contour_length_9, curv_contour_length_14.
The reader orders metadata files by number and lines in file order, skips (counts, logs) empty
PNGs -- the release has one, pathfinder32/curv_baseline/imgs/0/sample_172.png -- and splits the
sequence 80/10/10 into train/validation/test, as LRA's `train[:80%]` / `[80%:90%]` / `[90%:]`.

Generator (numpy drawing, anti-aliased): every image holds two target contours and distractor
contours, each a smooth random walk of dashed segments ("paddles") whose direction turns by at
most `MAX_TURN` per segment; contours keep a minimum distance from each other. Two disc markers
sit on the ends of the first target contour (label 1, connected) or on one end of each target
contour (label 0). Geometry is expressed in units of R / 32 pixels, so the same picture is drawn
at every resolution; difficulty grows with contour length (6, 9, 14 segments).
"""

import functools
import logging
import os

import numpy as np

from sptlib.data import sources
from sptlib.data.errors import DataError, int_label, located
from sptlib.data.release import check_count, write_atomically
from sptlib.errors import ConfigError

DIFFICULTIES = {6: "curv_baseline", 9: "curv_contour_length_9", 14: "curv_contour_length_14"}
MAX_TURN = np.pi / 6  # largest change of direction between consecutive segments
STEP = 1.6  # segment length (units of R/32 px)
DASH = 0.65  # fraction of each segment that is drawn (the rest is the gap)
WIDTH = 0.9  # stroke width (units)
MARKER_RADIUS = 1.3  # marker disc radius (units)
SEPARATION = 1.6  # minimum distance between points of different contours (units)
NUM_DISTRACTORS = 2
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
MIN_RESOLUTION = 8  # below this the contours and markers no longer fit apart


# ---------------------------------------------------------------------------------------------
# Generation


def _walks(rng, resolution, num_segments, unit, batch):
    """Random smooth polylines [k, num_segments + 1, 2] that stay inside the image (k <= batch)."""
    margin = 2.0 * unit
    p = rng.uniform(margin, resolution - margin, size=(batch, 1, 2))
    angle = rng.uniform(0, 2 * np.pi, size=(batch, 1))
    angles = angle + np.cumsum(rng.uniform(-MAX_TURN, MAX_TURN, size=(batch, num_segments)), 1)
    steps = STEP * unit * np.stack([np.cos(angles), np.sin(angles)], axis=-1)
    pts = np.concatenate([p, p + np.cumsum(steps, axis=1)], axis=1)
    inside = ((pts >= margin) & (pts <= resolution - margin)).all(axis=(1, 2))
    return pts[inside]


def _dense(pts, per_segment=3):
    """Points sampled along polylines [..., n, 2] -> [..., (n - 1) * per_segment + 1, 2]."""
    t = np.linspace(0, 1, per_segment, endpoint=False)[:, None]
    a, b = pts[..., :-1, None, :], pts[..., 1:, None, :]
    d = (a + t * (b - a)).reshape(pts.shape[:-2] + (-1, 2))
    return np.concatenate([d, pts[..., -1:, :]], axis=-2)


def _place(rng, resolution, num_segments, unit, taken, rounds=16, batch=64):
    """A contour at least SEPARATION away from the points `taken`, or (None, None)."""
    for _ in range(rounds):
        cands = _walks(rng, resolution, num_segments, unit, batch)
        if not len(cands):
            continue
        dense = _dense(cands)  # [k, m, 2]
        if len(taken):
            d2 = ((dense[:, :, None] - taken[None, None]) ** 2).sum(-1).min(axis=(1, 2))
            ok = np.nonzero(d2 >= (SEPARATION * unit) ** 2)[0]
            if not len(ok):
                continue
            return cands[ok[0]], dense[ok[0]]
        return cands[0], dense[0]
    return None, None


def _draw_segments(canvas, a, b, width):
    """Anti-aliased strokes from a[k] to b[k] ([k, 2] arrays, (x, y)) onto canvas (max-blend)."""
    r = canvas.shape[0]
    pix = _pixel_centres(r)  # [r*r, 2]
    for k0 in range(0, len(a), 64):  # chunks bound memory at large resolutions
        aa, bb = a[k0:k0 + 64], b[k0:k0 + 64]
        ab = bb - aa
        t = ((pix[:, None] - aa[None]) * ab[None]).sum(-1) / np.maximum((ab ** 2).sum(-1), 1e-9)
        t = np.clip(t, 0.0, 1.0)
        closest = aa[None] + t[..., None] * ab[None]
        d = np.sqrt(((pix[:, None] - closest) ** 2).sum(-1)).min(1)
        np.maximum(canvas, np.clip(width / 2 + 0.5 - d, 0.0, 1.0).reshape(r, r), out=canvas)


def _draw_disc(canvas, c, radius):
    r = canvas.shape[0]
    pix = _pixel_centres(r)
    d = np.sqrt(((pix - c) ** 2).sum(-1)).reshape(r, r)
    np.maximum(canvas, np.clip(radius + 0.5 - d, 0.0, 1.0), out=canvas)


@functools.lru_cache(maxsize=8)
def _pixel_centres(r):
    ys, xs = np.mgrid[0:r, 0:r].astype(np.float32) + 0.5
    return np.stack([xs.ravel(), ys.ravel()], axis=1)


def draw_sample(rng, resolution, contour_length, label):
    """Draws one image. Returns (uint8 image [R, R], geometry dict) or (None, None) on failure.

    geometry: `contours` (list of [n, 2] (x, y) polylines; 0 and 1 are the targets),
    `markers` ([2, 2] centres), `marker_contours` (the contour index each marker sits on).
    """
    unit = resolution / 32.0
    contours, taken = [], np.zeros((0, 2))
    for k in range(2 + NUM_DISTRACTORS):
        pts, dense = _place(rng, resolution, contour_length, unit, taken)
        if pts is None:
            if k < 2:
                return None, None  # targets must exist; retry with another draw
            break
        contours.append(pts)
        taken = np.concatenate([taken, dense])
    if label == 1:
        marker_contours = [0, 0]
        markers = np.stack([contours[0][0], contours[0][-1]])
    else:
        marker_contours = [0, 1]
        markers = np.stack([contours[0][rng.integers(2) * -1], contours[1][rng.integers(2) * -1]])
    canvas = np.zeros((resolution, resolution), np.float32)
    a, b = [], []
    for pts in contours:
        a.append(pts[:-1])
        b.append(pts[:-1] + DASH * (pts[1:] - pts[:-1]))
    _draw_segments(canvas, np.concatenate(a).astype(np.float32),
                   np.concatenate(b).astype(np.float32), WIDTH * unit)
    for m in markers:
        _draw_disc(canvas, m, MARKER_RADIUS * unit)
    img = np.round(canvas * 255).astype(np.uint8)
    return img, {"contours": contours, "markers": markers, "marker_contours": marker_contours}


def generate(num, *, resolution=32, contour_length=14, seed=0, held_out_from=None):
    """Yields (index, image uint8 [R, R], label, geometry) for `num` images, labels balanced.

    Image i is drawn from its own stream, seeded [seed, i]; images from index `held_out_from` on
    (the validation/test part of the 80/10/10 split) from a separate seed, [seed, i, 1], which no
    training image of any generated set uses.
    """
    labels = np.random.default_rng(seed).permutation(np.arange(num) % 2)
    for i in range(num):
        held_out = held_out_from is not None and i >= held_out_from
        # The trailing 1 matters: SeedSequence pads entropy with zeros, so [s, i, 0] == [s, i].
        rng = np.random.default_rng([seed, i, 1] if held_out else [seed, i])
        while True:
            img, geom = draw_sample(rng, resolution, contour_length, int(labels[i]))
            if img is not None:
                break
        yield i, img, int(labels[i]), geom


def generate_release(out_dir, *, resolution=32, num=2000, seed=0, contour_length=14,
                     images_per_folder=1000, progress=False, held_out_from=None):
    """Writes `out_dir/pathfinder{R}/<difficulty>/{imgs,metadata}`; returns that folder.

    `held_out_from`: see `generate` (`train_size(num)` draws validation and test from a seed
    never used for training)."""
    if contour_length not in DIFFICULTIES:
        raise ConfigError(f"contour_length={contour_length!r} (--contour_length): must be one "
                          f"of {sorted(DIFFICULTIES)}")
    check_count("resolution", resolution, MIN_RESOLUTION)
    check_count("num", num, 10)  # each split of the 80/10/10 split holds an image
    check_count("images_per_folder", images_per_folder, 1)
    final = os.path.join(out_dir, f"pathfinder{resolution}", DIFFICULTIES[contour_length])
    return write_atomically(final, lambda tmp: _write_release(
        tmp, resolution, num, seed, contour_length, images_per_folder, progress, held_out_from))


def _write_release(folder, resolution, num, seed, contour_length, images_per_folder, progress,
                   held_out_from):
    from PIL import Image
    os.makedirs(os.path.join(folder, "metadata"), exist_ok=True)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=num, desc=f"pathfinder{resolution}", unit="img")
    lines = {}
    for i, img, label, _ in generate(num, resolution=resolution, contour_length=contour_length,
                                     seed=seed, held_out_from=held_out_from):
        b = i // images_per_folder
        img_dir = os.path.join(folder, "imgs", str(b))
        os.makedirs(img_dir, exist_ok=True)
        name = f"sample_{i % images_per_folder}.png"
        Image.fromarray(img, mode="L").save(os.path.join(img_dir, name))
        # Release fields: folder, file, index, label, then generator parameters.
        lines.setdefault(b, []).append(
            f"imgs/{b} {name} {i % images_per_folder} {label} {resolution} {contour_length}\n")
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    for b, ls in lines.items():
        with open(os.path.join(folder, "metadata", f"{b}.npy"), "w") as f:
            f.writelines(ls)
    return folder


# ---------------------------------------------------------------------------------------------
# Reading


def folder_path(lra_dir, resolution, difficulty):
    return os.path.join(lra_dir, f"pathfinder{resolution}", difficulty)


def read_index(folder):
    """Parses metadata/*.npy -> (entries, num_empty); entries: (png path, label, meta file, line).

    Errors name the metadata file and line (malformed line, bad label, missing image).
    """
    meta_dir = os.path.join(folder, "metadata")
    if not os.path.isdir(meta_dir):
        raise DataError(f"{meta_dir}: Pathfinder metadata folder not found")
    names = [n for n in os.listdir(meta_dir) if n.endswith(".npy")]
    try:
        names.sort(key=lambda n: int(n[:-4]))
    except ValueError:
        names.sort()
    entries, empty = [], 0
    for name in names:
        meta = os.path.join(meta_dir, name)
        with open(meta) as f:
            for lineno, line in enumerate(f, start=1):
                cols = line.split()
                if not cols:
                    continue
                if len(cols) < 4:
                    raise located(meta, lineno, f"expected at least 4 fields "
                                                f"(folder file index label), got {len(cols)}")
                label = int_label(cols[3], meta, lineno, 2)
                path = os.path.join(folder, cols[0], cols[1])
                try:
                    size = os.path.getsize(path)
                except OSError:
                    raise located(meta, lineno, f"image {path} does not exist") from None
                if size == 0:
                    empty += 1
                    logging.warning("Pathfinder: skipping empty image %s (%s:%d)", path, meta,
                                    lineno)
                    continue
                entries.append((path, label, meta, lineno))
    if not entries:
        raise DataError(f"{meta_dir}: no images listed")
    return entries, empty


def train_size(n):
    """Number of training images among `n` entries (the 80% of the 80/10/10 split)."""
    return int(round(SPLIT_FRACTIONS[0] * n))


def split_entries(entries, split):
    n = len(entries)
    a = int(round(SPLIT_FRACTIONS[0] * n))
    b = int(round((SPLIT_FRACTIONS[0] + SPLIT_FRACTIONS[1]) * n))
    return {"train": entries[:a], "validation": entries[a:b], "test": entries[b:]}[split]


def load_png(path, resolution, where=""):
    """Decodes a single-channel PNG -> uint8 [R, R]; a clear error if corrupt or wrong size."""
    from PIL import Image
    try:
        with Image.open(path) as im:
            img = np.asarray(im.convert("L"))
    except Exception as e:  # PIL raises several types for corrupt data
        raise DataError(f"{path}{where}: cannot decode PNG ({type(e).__name__}: {e})") from None
    if img.shape != (resolution, resolution):
        raise DataError(f"{path}{where}: image is {img.shape}, expected "
                        f"({resolution}, {resolution})")
    return img


class PathfinderSource:
    """Random-access Pathfinder examples decoded from PNG on access (picklable)."""

    def __init__(self, entries, resolution, input_type, num_empty=0):
        self.paths = [e[0] for e in entries]
        self.where = [f" (listed at {e[2]}:{e[3]})" for e in entries]
        self.labels = np.asarray([e[1] for e in entries], np.int32)
        self.resolution = resolution
        self.input_type = input_type
        self.num_truncated = 0
        self.num_empty = num_empty

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        img = load_png(self.paths[i], self.resolution, self.where[i])
        ex = sources.encode_values(img.reshape(-1, 1), self.input_type)
        ex.update(label=self.labels[i], example_mask=np.bool_(True))
        return ex

    def filler(self):
        ex = sources.filler_values(self.input_type, self.resolution ** 2, 1)
        ex.update(label=np.int32(0), example_mask=np.bool_(False))
        return ex
