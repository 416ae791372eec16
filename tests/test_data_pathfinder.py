"""Pathfinder generator (geometry, balance, PNG format), release reader and its bad inputs."""

import os

import numpy as np
import pytest
from PIL import Image

from sptlib.data import data_config, get_task, pathfinder
from sptlib.data.__main__ import main as cli_main
from sptlib.data.errors import DataError


def nearest_contour(point, contours):
    """Index of the contour whose polyline passes closest to `point` (segment distances)."""
    best, arg = np.inf, -1
    for k, pts in enumerate(contours):
        a, b = pts[:-1], pts[1:]
        t = np.clip(((point - a) * (b - a)).sum(1) / ((b - a) ** 2).sum(1), 0, 1)
        d = np.sqrt(((a + t[:, None] * (b - a) - point) ** 2).sum(1)).min()
        if d < best:
            best, arg = d, k
    return arg, best


def test_generator_geometry_and_balance():
    samples = list(pathfinder.generate(200, resolution=32, contour_length=9, seed=1))
    labels = np.array([s[2] for s in samples])
    assert 0.45 <= labels.mean() <= 0.55
    for _, img, label, geom in samples:
        assert img.shape == (32, 32) and img.dtype == np.uint8
        on = [nearest_contour(m, geom["contours"]) for m in geom["markers"]]
        assert all(d < 1e-6 for _, d in on)  # each marker lies on a contour
        owners = [k for k, _ in on]
        assert owners == list(geom["marker_contours"])
        assert (owners[0] == owners[1]) == (label == 1)
        assert all(len(c) == 10 for c in geom["contours"][:2])  # 9 segments
        # Markers are drawn: the pixel under each marker centre is bright.
        for x, y in geom["markers"]:
            assert img[int(y), int(x)] > 200


def test_cli_release_layout_and_reader(tmp_path):
    assert cli_main(["pathfinder", "--out", str(tmp_path), "--resolution", "32", "--num", "30",
                     "--seed", "0", "--contour_length", "6", "--images_per_folder", "20",
                     "--no_progress"]) == 0
    folder = tmp_path / "pathfinder32" / "curv_baseline"
    assert sorted(os.listdir(folder / "imgs")) == ["0", "1"]
    assert sorted(os.listdir(folder / "metadata")) == ["0.npy", "1.npy"]
    with Image.open(folder / "imgs" / "1" / "sample_3.png") as im:
        assert im.mode == "L" and im.size == (32, 32)
    expected = [(img, label) for _, img, label, _ in pathfinder.generate(
        30, resolution=32, contour_length=6, seed=0)]
    cfg = data_config()
    cfg.update(task="pathfinder", lra_dir=str(tmp_path), difficulty="curv_baseline",
               input_type="continuous")
    task = get_task(cfg)
    assert task.info["max_length"] == 1024 and task.info["vocab_size"] == 0
    assert [task.num_examples(s) for s in ("train", "validation", "test")] == [24, 3, 3]
    b = next(task.make_iterator("test", batch_size=4, seed=0, num_epochs=1,
                                drop_remainder=False))
    assert b["inputs"].shape == (4, 1024, 1) and b["raw"].shape == (4, 1024, 1)
    for j in range(3):
        img, label = expected[27 + j]
        np.testing.assert_array_equal(b["raw"][j, :, 0], img.reshape(-1))
        np.testing.assert_allclose(b["inputs"][j, :, 0], img.reshape(-1) / 127.5 - 1, atol=1e-6)
        assert b["label"][j] == label
    assert b["example_mask"].tolist() == [True, True, True, False]


def write_release(folder, rows, res=8):
    """Writes a tiny release-format folder; rows: (batch, index, label, kind)."""
    os.makedirs(folder / "metadata", exist_ok=True)
    lines = {}
    for b, i, label, kind in rows:
        d = folder / "imgs" / str(b)
        os.makedirs(d, exist_ok=True)
        path = d / f"sample_{i}.png"
        if kind == "png":
            Image.fromarray(np.full((res, res), 10 * i + label, np.uint8), "L").save(path)
        elif kind == "empty":
            path.write_bytes(b"")
        elif kind == "corrupt":
            path.write_bytes(b"\x89PNG\r\n\x1a\nthis is not a png")
        lines.setdefault(b, []).append(f"imgs/{b} sample_{i}.png {i} {label} 75 1.5 1 1.0\n")
    for b, ls in lines.items():
        (folder / "metadata" / f"{b}.npy").write_text("".join(ls))


def test_reader_release_format_and_empty_png(tmp_path):
    folder = tmp_path / "pathfinder8" / "curv_contour_length_14"
    rows = [(0, i, i % 2, "empty" if i == 3 else "png") for i in range(6)]
    rows += [(1, i, 1, "png") for i in range(5)]
    write_release(folder, rows)
    entries, empty = pathfinder.read_index(str(folder))
    assert empty == 1 and len(entries) == 10
    src = pathfinder.PathfinderSource(entries, 8, "tokens", empty)
    labels = [src[k]["label"] for k in range(10)]
    assert labels == [0, 1, 0, 0, 1, 1, 1, 1, 1, 1]
    # Tokens are pixel + 2; file sample_4 of folder 0 holds the value 10 * 4 + 0.
    assert (src[3]["inputs"] == 40 + 2).all() and src[3]["mask"].all()
    assert [len(pathfinder.split_entries(entries, s)) for s in
            ("train", "validation", "test")] == [8, 1, 1]


@pytest.mark.parametrize("kind,needle", [
    ("missing", "does not exist"), ("label", "outside 0..1"), ("fields", "expected at least 4")])
def test_bad_metadata_names_file_and_line(tmp_path, kind, needle):
    folder = tmp_path / "pf"
    write_release(folder, [(0, 0, 1, "png"), (0, 1, 0, "png")])
    meta = folder / "metadata" / "0.npy"
    extra = {"missing": "imgs/0 sample_9.png 9 1\n", "label": "imgs/0 sample_0.png 0 3\n",
             "fields": "imgs/0 sample_0.png\n"}[kind]
    meta.write_text(meta.read_text() + extra)
    with pytest.raises(DataError, match=needle) as e:
        pathfinder.read_index(str(folder))
    assert f"{meta}:3:" in str(e.value)


def test_corrupt_png_names_image_and_metadata_line(tmp_path):
    folder = tmp_path / "pf"
    write_release(folder, [(0, 0, 1, "png"), (0, 1, 0, "corrupt")])
    entries, _ = pathfinder.read_index(str(folder))
    src = pathfinder.PathfinderSource(entries, 8, "tokens")
    with pytest.raises(DataError, match="cannot decode PNG") as e:
        src[1]
    assert "sample_1.png" in str(e.value) and "0.npy:2" in str(e.value)


def test_missing_lra_dir_and_generate_on_demand(tmp_path):
    cfg = data_config()
    cfg.update(task="pathx", lra_dir=str(tmp_path / "none"))
    with pytest.raises(DataError, match="pathfinder128/curv_contour_length_14") as e:
        get_task(cfg)
    assert "python -m sptlib.data pathfinder" in str(e.value)
    cfg.update(task="pathfinder", lra_dir=str(tmp_path / "gen"))
    cfg.generate.update(enabled=True, num_train=16, num_val=2, num_test=2)
    task = get_task(cfg)
    assert task.info["vocab_size"] == 258
    b = next(task.make_iterator("train", batch_size=8, seed=0))
    assert b["inputs"].shape == (8, 1024) and b["inputs"].min() >= 2


def test_held_out_images_come_from_a_seed_no_training_image_uses():
    n, cut = 40, pathfinder.train_size(40)
    plain = [img for _, img, _, _ in pathfinder.generate(n, resolution=16, seed=3)]
    held = [img for _, img, _, _ in pathfinder.generate(n, resolution=16, seed=3,
                                                         held_out_from=cut)]
    # Training images are the same with or without a held-out part ...
    assert all(np.array_equal(a, b) for a, b in zip(plain[:cut], held[:cut]))
    # ... and every held-out image is new: equal to no image drawn from the training streams.
    train_stream = plain  # streams [seed, i] for every i, train and former eval positions alike
    for img in held[cut:]:
        assert not any(np.array_equal(img, t) for t in train_stream)
