"""The generated Lines task: labels checked by an independent detector, balance, no pixel-count
shortcut, determinism, held-out streams, and the Task built from a config."""

import numpy as np
import pytest

from sptlib import data as data_lib
from sptlib.data import orientation as lines

LIT = 0.55 * 255  # segment/dot pixels are >= 0.6, background <= 0.25


def detect_direction(img):
    """Directions in which two lit pixels touch (independent of the generator's code)."""
    lit = img >= LIT
    found = set()
    r = lit.shape[0]
    for y in range(r):
        for x in range(r):
            if not lit[y, x]:
                continue
            for label, (dy, dx) in enumerate(((0, 1), (1, 0), (1, 1), (1, -1))):
                yy, xx = y + dy, x + dx
                if 0 <= yy < r and 0 <= xx < r and lit[yy, xx]:
                    found.add(label)
    return found


def test_every_label_is_the_only_direction_with_touching_pixels():
    images, labels = lines.generate(200, resolution=16, seed=3)
    for img, label in zip(images, labels):
        assert detect_direction(img) == {int(label)}
        n_lit = int((img >= LIT).sum())
        assert 4 + 4 <= n_lit <= 7 + 10


def test_balanced_and_no_pixel_count_shortcut():
    images, labels = lines.generate(2000, resolution=16, seed=0)
    assert np.bincount(labels).tolist() == [500] * 4
    lit = (images >= LIT).sum(axis=(1, 2))
    means = [lit[labels == c].mean() for c in range(4)]
    # The number of lit pixels says (almost) nothing about the direction.
    assert max(means) - min(means) < 0.5
    intensity = [images[labels == c].mean() for c in range(4)]
    assert max(intensity) - min(intensity) < 1.0


def test_deterministic_prefix_stable_and_held_out_differs():
    a, la = lines.generate(40, seed=1)
    b, lb = lines.generate(80, seed=1)
    np.testing.assert_array_equal(a, b[:40])
    np.testing.assert_array_equal(la, lb[:40])
    held, _ = lines.generate(40, seed=1, held_out=True)
    assert not any((held[i] == a[j]).all() for i in range(40) for j in range(40))
    other, _ = lines.generate(40, seed=2)
    assert not (other == a).all()


def test_task_from_config():
    cfg = data_lib.data_config()
    cfg.task, cfg.input_type, cfg.resolution = "lines", "continuous", 12
    cfg.generate.update(num_train=64, num_val=16, num_test=24)
    task = data_lib.get_task(cfg)
    assert task.info["num_classes"] == 4 and task.info["max_length"] == 144
    assert [task.num_examples(s) for s in ("train", "validation", "test")] == [64, 16, 24]
    batch = next(task.make_iterator("train", batch_size=8, seed=0))
    assert batch["inputs"].shape == (8, 144, 1) and batch["raw"].shape == (8, 144, 1)
    assert batch["inputs"].min() >= -1 and batch["inputs"].max() <= 1
    # The validation and test sets come from the held-out stream, disjoint halves of one draw.
    val = task.source("validation").values[:, :, 0]
    test = task.source("test").values[:, :, 0]
    held, _ = lines.generate(40, resolution=12, seed=0, held_out=True)
    np.testing.assert_array_equal(val, held[:16].reshape(16, -1))
    np.testing.assert_array_equal(test, held[16:].reshape(24, -1))
    cfg.resolution = 6
    with pytest.raises(ValueError, match="resolution must be >= 8"):
        data_lib.get_task(cfg)


def test_gratings_stripes_run_in_the_label_direction():
    """Independent truth: pixels are most alike along the stripes, so the direction with the
    smallest mean neighbour difference is the label."""
    images, labels = lines.generate(200, resolution=12, seed=5, style="gratings")
    steps = ((0, 1), (1, 0), (1, 1), (1, -1))
    for img, label in zip(images.astype(float), labels):
        diffs = []
        for dy, dx in steps:
            # Every pixel pair (y, x), (y + dy, x + dx) inside the image.
            y0, y1 = max(0, -dy), img.shape[0] - max(0, dy)
            x0, x1 = max(0, -dx), img.shape[1] - max(0, dx)
            a = img[y0:y1, x0:x1]
            b = img[y0 + dy:y1 + dy, x0 + dx:x1 + dx]
            diffs.append(np.abs(a - b).mean())
        assert int(np.argmin(diffs)) == int(label)
    # Same intensity histogram for every direction (no per-pixel shortcut).
    big, big_labels = lines.generate(2000, resolution=8, seed=0, style="gratings")
    means = [big[big_labels == c].mean() for c in range(4)]
    assert max(means) - min(means) < 2.0
    with pytest.raises(ValueError, match="style"):
        lines.generate(4, style="zigzag")
