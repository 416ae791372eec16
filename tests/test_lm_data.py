"""Causal LM data: the offline code corpus (manifest, split, skips) and the packed windows."""

import hashlib

import numpy as np
import pytest

from sptlib import vocab
from sptlib.data import config as data_config
from sptlib.data import catalog, lm, pipeline
from sptlib.data.errors import DataError


def _tree(root, files):
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


FILES = {
    "pkg_a/__init__.py": b"import os\n",
    "pkg_a/sub/mod.py": b"def f(x):\n    return x + 1\n" * 20,
    "pkg_a/notes.txt": b"not python",  # not *.py: never listed
    "pkg_b/z.py": "caf\u00e9 = 'utf-8 ok'\n".encode() * 30,
    "pkg_b/blob.py": b"abc\x00def",  # NUL byte: binary
    "pkg_b/latin.py": b"x = '\xff\xfe'\n",  # not UTF-8
}


@pytest.fixture
def tree(tmp_path):
    _tree(tmp_path, FILES)
    return {"pkg_a": str(tmp_path / "pkg_a"), "pkg_b": str(tmp_path / "pkg_b")}


def test_manifest_is_stable_and_counts_skips(tree, tmp_path):
    a = lm.build_corpus(roots=tree, max_bytes=10_000)
    b = lm.build_corpus(roots=tree, max_bytes=10_000)
    assert a.manifest["checksum"] == b.manifest["checksum"]
    for s in a.streams:
        np.testing.assert_array_equal(a.streams[s], b.streams[s])
    assert a.manifest["skipped"] == {"undecodable": 1, "binary": 1, "over_budget": 0}
    assert [f["path"] for f in a.manifest["files"]] == ["pkg_a/__init__.py", "pkg_a/sub/mod.py",
                                                       "pkg_b/z.py"]
    # The checksum is sha256 over (path, split, content sha256) lines: recompute it by hand.
    h = hashlib.sha256()
    for f in a.manifest["files"]:
        content = (tmp_path / f["path"]).read_bytes()
        assert f["sha256"] == hashlib.sha256(content).hexdigest()
        h.update(f"{f['path']}\t{f['split']}\t{f['sha256']}\n".encode())
    assert a.manifest["checksum"] == h.hexdigest()
    # Changing one byte of one file changes the checksum.
    (tmp_path / "pkg_a/__init__.py").write_bytes(b"import sys\n")
    assert lm.build_corpus(roots=tree, max_bytes=10_000).manifest["checksum"] != \
        a.manifest["checksum"]


def test_streams_hold_each_file_once_in_its_split(tree, tmp_path):
    c = lm.build_corpus(roots=tree, max_bytes=10_000, validation_percent=30, test_percent=30)
    total = sum(len(s) for s in c.streams.values())
    assert total == c.manifest["bytes"] + c.manifest["num_files"]  # bytes + one EOF per file
    for f in c.manifest["files"]:
        ids = np.frombuffer((tmp_path / f["path"]).read_bytes(), np.uint8).astype(np.int32) + \
            vocab.NUM_SPECIAL
        stream = c.streams[f["split"]]
        hits = [i for i in range(len(stream) - len(ids) + 1)
                if np.array_equal(stream[i:i + len(ids)], ids)]
        assert len(hits) == 1 and stream[hits[0] + len(ids)] == lm.EOF_ID
        # The split depends on the path only.
        assert f["split"] == lm.split_of(f["path"], 30, 30)
    assert all(s.min() >= vocab.NUM_SPECIAL for s in c.streams.values() if len(s))


def test_byte_budget_and_empty_corpus(tree, tmp_path):
    small = lm.build_corpus(roots=tree, max_bytes=600)
    assert small.manifest["bytes"] <= 600 and small.manifest["skipped"]["over_budget"] >= 1
    with pytest.raises(DataError, match="corpus is empty"):
        lm.build_corpus(roots={"pkg_b": tree["pkg_b"]}, max_bytes=5)
    with pytest.raises(DataError, match="not an installed package"):
        lm.package_dir("no_such_package_xyz")


def test_windows_tile_the_stream_and_are_deterministic():
    stream = np.random.default_rng(0).integers(2, 258, size=1000).astype(np.int32)
    src = lm.WindowSource(stream, 64)
    assert len(src) == 15 and src.num_dropped == 1000 - 15 * 64
    np.testing.assert_array_equal(np.concatenate([src[i]["inputs"] for i in range(len(src))]),
                                  stream[:15 * 64])
    assert all(src[i]["mask"].all() for i in range(len(src)))
    # Evaluation order: the grain pipeline returns the windows in stream order, last batch padded.
    it = pipeline.make_iterator(src, batch_size=4, seed=0, shuffle=False, num_epochs=1,
                                drop_remainder=False)
    batches = list(it)
    real = np.concatenate([b["inputs"][b["example_mask"]] for b in batches])
    np.testing.assert_array_equal(real.reshape(-1), stream[:15 * 64])
    # Training order: one epoch is a permutation of the windows (no gap, no overlap), and the
    # same seed gives the same order.
    def epoch(seed):
        it = pipeline.make_iterator(src, batch_size=5, seed=seed, shuffle=True, num_epochs=1)
        return np.concatenate([b["inputs"] for b in it])
    a, b = epoch(3), epoch(3)
    np.testing.assert_array_equal(a, b)
    starts = sorted(int(np.flatnonzero([np.array_equal(w, src[i]["inputs"])
                                        for i in range(len(src))])[0]) for w in a)
    assert starts == list(range(15))
    # Longer evaluation windows on a token limit read the same text.
    long = lm.WindowSource(stream, 256, limit_tokens=768)
    np.testing.assert_array_equal(np.concatenate([long[i]["inputs"] for i in range(3)]),
                                  stream[:768])
    with pytest.raises(DataError, match="no window"):
        lm.WindowSource(stream[:10], 64)


def test_code_lm_task_from_an_installed_package():
    cfg = data_config.data_config()
    cfg.task = "code_lm"
    cfg.max_length = 128
    cfg.lm.packages = ("ml_collections",)
    cfg.lm.max_bytes = 100_000
    cfg.lm.validation_percent = cfg.lm.test_percent = 20
    cfg.lm.eval_tokens = 1024
    task = catalog.get_task(cfg)
    assert task.info["vocab_size"] == lm.BYTE_LM_VOCAB_SIZE == 259
    assert task.num_examples("test") == 1024 // 128
    assert len(task.info["corpus_checksum"]) == 64
    batch = next(task.make_iterator("train", batch_size=2, seed=0))
    assert batch["inputs"].shape == (2, 128) and batch["mask"].all()
