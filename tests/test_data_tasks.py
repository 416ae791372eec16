"""Retrieval (AAN) reader, Fashion-MNIST idx files, TFDS-backed tasks on mock data (Speech
Commands: tests/test_data_speech_commands.py)."""

import gzip
import struct

import numpy as np
import pytest

from sptlib.data import aan, data_config, fashion_mnist, get_task, sequence_length, task_info
from sptlib.data.errors import DataError


def write_aan(lra_dir, rows_by_split):
    d = lra_dir / "tsv_data"
    d.mkdir(parents=True)
    for split, fname in aan.SPLIT_FILES.items():
        (d / fname).write_text("".join("\t".join(r) + "\n" for r in rows_by_split[split]))


def test_aan_release_format(tmp_path):
    rows = [("1.0", "a1", "b1", "hello world", "héllo"), ("0.0", "a2", "b2", "x" * 30, "y")]
    write_aan(tmp_path, {"train": rows, "validation": rows[:1], "test": rows[1:]})
    cfg = data_config()
    cfg.update(task="retrieval", lra_dir=str(tmp_path), max_length=16)
    task = get_task(cfg)
    assert task.info["pair"] and task.info["vocab_size"] == 258
    b = next(task.make_iterator("train", batch_size=2, seed=0, num_epochs=1,
                                drop_remainder=False))
    order = np.argsort(-b["label"])  # label 1 first
    assert b["label"][order].tolist() == [1, 0]
    first = b["inputs"][order[0]]
    assert first[:11].tolist() == [c + 2 for c in b"hello world"] and first[11:].sum() == 0
    assert b["inputs2"][order[0]][:6].tolist() == [c + 2 for c in "héllo".encode()]
    assert b["mask2"][order[0]].sum() == 6 and b["mask"][order[1]].all()
    assert task.num_truncated["train"] == 1  # the 30-byte document


@pytest.mark.parametrize("row,needle", [
    ("1\ta\tb\tonly four", "expected 5 tab-separated columns"),
    ("yes\ta\tb\tt1\tt2", "is not a number"),
    ("2\ta\tb\tt1\tt2", "is not 0 or 1"),
])
def test_aan_bad_rows(tmp_path, row, needle):
    path = tmp_path / "new_aan_pairs.train.tsv"
    path.write_text("0\ta\tb\tt1\tt2\n" + row + "\n")
    with pytest.raises(DataError, match=needle) as e:
        aan.read_split(str(path))
    assert f"{path}:2:" in str(e.value)
    with pytest.raises(DataError, match="new_aan_pairs.eval.tsv: AAN retrieval split file"):
        aan.read_split(str(tmp_path / "new_aan_pairs.eval.tsv"))


def write_idx(path, array, magic, compress):
    header = struct.pack(">II", magic, len(array))
    if array.ndim == 3:
        header += struct.pack(">II", *array.shape[1:])
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def test_fashion_mnist_idx(tmp_path):
    rng = np.random.default_rng(0)
    train = rng.integers(0, 256, (20, 28, 28))
    test = rng.integers(0, 256, (5, 28, 28))
    write_idx(tmp_path / "train-images-idx3-ubyte", train, 2051, True)
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.arange(20) % 10, 2049, True)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", test, 2051, False)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.arange(5), 2049, False)
    cfg = data_config()
    cfg.update(task="fashion_mnist", fashion_mnist_dir=str(tmp_path), input_type="tokens")
    task = get_task(cfg)
    assert [task.num_examples(s) for s in ("train", "validation", "test")] == [18, 2, 5]
    b = next(task.make_iterator("validation", batch_size=2, seed=0, num_epochs=1))
    np.testing.assert_array_equal(b["inputs"], train[18:].reshape(2, 784) + 2)
    assert b["label"].tolist() == [8, 9]
    cfg.update(resolution=14, input_type="continuous")
    b = next(get_task(cfg).make_iterator("test", batch_size=5, seed=0, num_epochs=1))
    pooled = np.round(test.reshape(5, 14, 2, 14, 2).mean((2, 4)))
    np.testing.assert_array_equal(b["raw"][..., 0], pooled.reshape(5, 196))
    assert b["inputs"].shape == (5, 196, 1) and b["inputs"].dtype == np.float32
    # Bad magic names the file.
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.arange(5), 2051 + 7, False)
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte: bad idx magic"):
        fashion_mnist.load(str(tmp_path), "test")


def test_fashion_mnist_missing_says_how_to_install(tmp_path):
    cfg = data_config()
    cfg.update(task="fashion_mnist", fashion_mnist_dir=str(tmp_path / "none"))
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        get_task(cfg)


@pytest.fixture(scope="module")
def tfds_mock():
    tfds = pytest.importorskip("tensorflow_datasets")
    return tfds


def test_text_and_cifar_tasks_on_mock_data(tfds_mock):
    with tfds_mock.testing.mock_data(num_examples=10):
        cfg = data_config()
        cfg.update(task="text", max_length=64)
        task = get_task(cfg)
        recs = task.source("validation")._records
        b = next(task.make_iterator("validation", batch_size=4, seed=0, num_epochs=1))
        for j in range(4):
            raw = recs[j]["text"].encode()[:64]
            assert b["inputs"][j, :len(raw)].tolist() == [c + 2 for c in raw]
            assert b["mask"][j].sum() == len(raw) and b["label"][j] == recs[j]["label"]
        for rgb, shape in ((False, (4, 1024, 1)), (True, (4, 1024, 3))):
            cfg = data_config()
            cfg.update(task="scifar" if rgb else "image", input_type="continuous")
            task = get_task(cfg)
            recs = task.source("test")._records
            b = next(task.make_iterator("test", batch_size=4, seed=0, num_epochs=1))
            assert b["inputs"].shape == shape and task.info["d_input"] == shape[-1]
            img = recs[1]["image"].astype(np.float64)
            want = img.reshape(-1, 3) if rgb else np.round(
                img @ [0.2989, 0.5870, 0.1140]).reshape(-1, 1)
            np.testing.assert_array_equal(b["raw"][1], want)
        cfg.update(input_type="tokens")
        task = get_task(cfg)
        assert task.info["max_length"] == 3072
        assert next(task.make_iterator("train", batch_size=2, seed=0))["inputs"].shape == (2, 3072)


def test_lra_tfds_builders_match_file_readers(tmp_path):
    """source='tfds' (ArrayRecord prepared from the release files) yields the same batches."""
    pytest.importorskip("tensorflow_datasets")
    from sptlib.data import listops, pathfinder
    lra = tmp_path / "lra"
    listops.generate_release(str(lra), num_train=12, num_val=4, num_test=4, seed=0,
                             min_length=10, max_length=40)
    pathfinder.generate_release(str(lra), resolution=32, num=20, seed=0, contour_length=14)
    write_aan(lra, {s: [("1", "a", "b", "doc one", "doc two"), ("0", "c", "d", "x", "yy")]
                    for s in aan.SPLIT_FILES})
    for task_name, input_type in (("listops", "tokens"), ("pathfinder", "continuous"),
                                  ("retrieval", "tokens")):
        batches = {}
        for source in ("files", "tfds"):
            cfg = data_config()
            cfg.update(task=task_name, lra_dir=str(lra), tfds_data_dir=str(tmp_path / "tfds"),
                       source=source, input_type=input_type, max_length=0)
            it = get_task(cfg).make_iterator("test", batch_size=2, seed=0, num_epochs=1,
                                             drop_remainder=False)
            batches[source] = list(it)
        for a, b in zip(batches["files"], batches["tfds"]):
            assert a.keys() == b.keys()
            for k in a:
                np.testing.assert_array_equal(a[k], b[k], err_msg=f"{task_name}/{k}")


@pytest.mark.parametrize("task,fields,want", [
    ("listops", {}, 2000), ("listops", {"max_length": 300}, 300),
    ("lines", {}, 256), ("lines", {"resolution": 8}, 64),
    ("pathfinder", {"resolution": 16}, 256),
])
def test_sequence_length_is_the_built_tasks_length(tmp_path, task, fields, want):
    """`sequence_length(config.data)` reads no data, yet equals the built Task's max_length."""
    cfg = data_config()
    cfg.update(task=task, lra_dir=str(tmp_path), **fields)
    cfg.generate.update(enabled=True, num_train=8, num_val=2, num_test=2, min_length=10,
                        max_length=40)
    assert sequence_length(cfg) == want
    built = get_task(cfg).info
    assert built["max_length"] == want and built == task_info(cfg)


def test_task_info_matches_the_readers_and_hand_written_values():
    """`task_info` (config only; what AOT compiles and benchmarks use) agrees with the readers'
    class lists and with values written out by hand from each task's description."""
    from sptlib.data import defaults, speech_commands
    from sptlib.data import orientation as lines
    assert defaults.NUM_CLASSES["lines"] == len(lines.CLASS_NAMES) == lines.NUM_CLASSES
    assert defaults.NUM_CLASSES["speech_commands"] == len(speech_commands.WORDS)
    # task, input_type, extra config -> (vocab_size, num_classes, max_length, d_input, pair);
    # 2 reserved ids (<pad>, <mask>) + 256 bytes / pixel values; ListOps: 2 + 15 symbols; byte
    # LMs: 2 + 256 bytes + the end-of-file separator.
    want = {
        ("listops", "tokens", ()): (17, 10, 2000, 1, False),
        ("text", "tokens", (("max_length", 96),)): (258, 2, 96, 1, False),
        ("retrieval", "tokens", ()): (258, 2, 4000, 1, True),
        ("pathx", "tokens", ()): (258, 2, 128 * 128, 1, False),
        ("pathfinder", "continuous", (("resolution", 14),)): (0, 2, 196, 1, False),
        ("lines", "continuous", ()): (0, 4, 256, 1, False),
        ("image", "continuous", ()): (0, 10, 1024, 1, False),
        ("scifar", "tokens", ()): (258, 10, 3072, 1, False),
        ("scifar", "continuous", ()): (0, 10, 1024, 3, False),
        ("fashion_mnist", "tokens", ()): (258, 10, 784, 1, False),
        ("speech_commands", "continuous", ()): (0, 35, 16000, 1, False),
        ("code_lm", "tokens", ()): (259, 0, 512, 1, False),
    }
    for (task, input_type, fields), values in want.items():
        cfg = data_config()
        cfg.update(task=task, input_type=input_type, **dict(fields))
        info = task_info(cfg)
        got = tuple(info[k] for k in ("vocab_size", "num_classes", "max_length", "d_input",
                                      "pair"))
        assert got == values and info["input_type"] == input_type, (task, input_type, fields)
