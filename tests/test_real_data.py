"""The real-data tasks on small generated files of the same format: code_bytes (a generated tree
of packages) and the Fashion-MNIST test limit and cache. Nothing here reads installed data."""

import gzip
import os

import numpy as np
import pytest

from sptlib.data import code_bytes, fashion_mnist, get_task
from sptlib.data.config import data_config
from sptlib.data.defaults import task_info
from sptlib.data.errors import DataError

HEADER = "# Copyright {pkg} authors. Licensed under the {pkg} license.\n"
LENGTH = 64


def _write_tree(root, packages=("alpha", "beta", "gamma"), files=(12, 20, 30)):
    """Packages of *.py files; every body line names its file (`<pkg>:<i>`) so a window's file
    can be read back from its bytes."""
    for pkg, n in zip(packages, files):
        for i in range(n):
            d = os.path.join(root, pkg, "sub" if i % 3 else "")
            os.makedirs(d, exist_ok=True)
            lines = [HEADER.format(pkg=pkg)] * 3 + [f"import {pkg}\n", f"from {pkg} import x\n"]
            # 1-6 windows of body: lines of 16 bytes "F<pkg initial><i:03d>..........\n".
            body = [f"F{pkg[0]}{i:03d}{'.' * 10}\n" for _ in range(4 * (1 + i % 6))]
            body.insert(2, f"    import {pkg}.inner\n")  # an indented import is removed too
            with open(os.path.join(d, f"m{i}.py"), "w") as f:
                f.write("".join(lines + body))
    with open(os.path.join(root, "alpha", "binary.py"), "wb") as f:
        f.write(b"\x00" * 200)
    return packages


def _cfg(root, packages, **kw):
    cfg = data_config()
    cfg.task = "code_bytes"
    cfg.max_length = LENGTH
    cfg.code_bytes.update(root=str(root), packages=tuple(packages), header_lines=3,
                          max_windows_per_file=4, validation_percent=20, test_percent=20)
    cfg.update(kw)
    return cfg


def _files_of(task, split):
    """{(label, file tag)} of every window of a split, read back from the token ids."""
    src = task.source(split)
    out = set()
    for i in range(len(src)):
        ex = src[i]
        text = bytes((ex["inputs"][ex["mask"]] - 2).astype(np.uint8).tolist()).decode()
        tags = {line[:5] for line in text.splitlines() if line.startswith("F")}
        out |= {(int(ex["label"]), t) for t in tags}
    return out


def test_code_bytes_splits_labels_and_stripping(tmp_path):
    packages = _write_tree(tmp_path)
    task = get_task(_cfg(tmp_path, packages))
    assert task.info["num_classes"] == 3 and task.info["vocab_size"] == 258
    assert task.info["max_length"] == LENGTH
    # Balanced classes in every split; labels are the package's position.
    for split in ("train", "validation", "test"):
        src = task.source(split)
        counts = np.bincount(src.labels, minlength=3)
        assert len(set(counts.tolist())) == 1 and counts[0] > 0, (split, counts)
        for i in range(len(src)):
            ex = src[i]
            text = bytes((ex["inputs"] - 2).astype(np.uint8).tolist())
            assert ex["mask"].all()  # full windows, no padding
            # Header and import lines are gone; the body names the right package.
            assert b"Copyright" not in text and b"import" not in text
            assert text.startswith(b"F") or b"\nF" in text
            assert {t[1] for t in text.decode().split() if t.startswith("F")} == {
                packages[int(ex["label"])][0]}
    # No file has windows in two splits.
    seen = {s: {t for _, t in _files_of(task, s)} for s in ("train", "validation", "test")}
    assert not seen["train"] & seen["validation"]
    assert not seen["train"] & seen["test"] and not seen["validation"] & seen["test"]
    w = code_bytes.windows_for(task.cfg)
    assert w.manifest["skipped"]["binary"] == 1
    assert task.info["checksum"] == w.manifest["checksum"]


def test_code_bytes_windows_test_limit_and_shorter_reads(tmp_path):
    packages = _write_tree(tmp_path)
    full = get_task(_cfg(tmp_path, packages))
    limited = get_task(_cfg(tmp_path, packages, test_examples=4))
    assert limited.num_examples("test") == 4
    np.testing.assert_array_equal(limited.source("test")[3]["inputs"],
                                  full.source("test")[3]["inputs"])
    # A shorter max_length with the window fixed reads the first bytes of the same windows.
    cfg = _cfg(tmp_path, packages, max_length=16)
    cfg.code_bytes.window = LENGTH
    short = get_task(cfg)
    assert short.info["max_length"] == 16
    assert short.num_examples("train") == full.num_examples("train")
    np.testing.assert_array_equal(short.source("train")[0]["inputs"],
                                  full.source("train")[0]["inputs"][:16])
    # windows_of keeps at most max_windows, spread over the file.
    picks = code_bytes.windows_of(bytes(range(100)) * 10, 100, 3)
    assert [i for i, _ in picks] == [0, 4, 9]


def test_code_bytes_missing_sources_name_where_they_were_looked_for(tmp_path):
    packages = _write_tree(tmp_path)
    with pytest.raises(DataError, match=r"package folders \['delta'\] not found under"):
        get_task(_cfg(tmp_path, packages + ("delta",)))
    cfg = _cfg(tmp_path, ("surely_not_an_installed_package_xyz", "numpy"))
    cfg.code_bytes.root = ""
    with pytest.raises(DataError, match="surely_not_an_installed_package_xyz.*not installed"):
        get_task(cfg)
    with pytest.raises(DataError, match="at least two packages"):
        get_task(_cfg(tmp_path, ("alpha",)))
    # A package whose files are all too short for one window.
    with pytest.raises(DataError, match="no 4096-byte window"):
        get_task(_cfg(tmp_path, packages, max_length=4096))


def test_code_bytes_info_without_reading(tmp_path):
    cfg = _cfg(tmp_path / "nowhere", ("a", "b", "c", "d"))
    cfg.max_length = 0
    assert task_info(cfg)["num_classes"] == 4 and task_info(cfg)["max_length"] == 2048


def _write_idx(path, array, magic):
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    with gzip.open(str(path) + ".gz", "wb") as f:
        f.write(header + np.asarray(array, np.uint8).tobytes())


def _fmnist(folder, n_train=20, n_test=7, seed=0):
    rng = np.random.default_rng(seed)
    test = rng.integers(0, 256, (n_test, 28, 28))
    _write_idx(folder / "train-images-idx3-ubyte", rng.integers(0, 256, (n_train, 28, 28)), 2051)
    _write_idx(folder / "train-labels-idx1-ubyte", np.arange(n_train) % 10, 2049)
    _write_idx(folder / "t10k-images-idx3-ubyte", test, 2051)
    _write_idx(folder / "t10k-labels-idx1-ubyte", np.arange(n_test) % 10, 2049)
    return test


def test_fashion_mnist_test_limit_and_cache_follows_the_files(tmp_path):
    test = _fmnist(tmp_path)
    cfg = data_config()
    cfg.update(task="fashion_mnist", fashion_mnist_dir=str(tmp_path), input_type="tokens",
               test_examples=3)
    task = get_task(cfg)
    assert [task.num_examples(s) for s in ("train", "validation", "test")] == [18, 2, 3]
    np.testing.assert_array_equal(task.source("test")[2]["inputs"], test[2].reshape(-1) + 2)
    images, _ = fashion_mnist.load(str(tmp_path), "test")
    assert not images.flags.writeable  # cached arrays are shared: read-only
    # Rewritten files are read again, not served from the cache.
    os.utime(tmp_path / "t10k-images-idx3-ubyte.gz", ns=(1, 1))
    test2 = _fmnist(tmp_path, n_test=5, seed=1)
    os.utime(tmp_path / "t10k-images-idx3-ubyte.gz", ns=(2, 2))
    images, _ = fashion_mnist.load(str(tmp_path), "test")
    np.testing.assert_array_equal(images, test2)


@pytest.mark.skipif(not os.path.isdir("/usr/share/datasets/fashion-mnist"),
                    reason="dataset-fashion-mnist not installed")
def test_fashion_mnist_real_files_when_installed():
    images, labels = fashion_mnist.load("/usr/share/datasets/fashion-mnist", "test", 14)
    assert images.shape == (10000, 14, 14) and np.bincount(labels).tolist() == [1000] * 10
