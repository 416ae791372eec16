"""The user's own files (`config.data.task = "files"`): every format and input kind read from real
files written here, the inferred spec against hand-counted values, and every bad input of the
list (one line naming file, row and column; nothing written)."""

import csv
import json
import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sptlib import errors
from sptlib.data import data_config, get_task, record_spec, task_info, user_files
from sptlib.protocol import stages
from sptlib.train import preflight

from sptlib.experiments import files as files_experiment
from sptlib.configs import testing

SEQS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9], [3, 2], [3, 8, 4, 6]] * 4
LABELS = ["dog", "cat", "cat", "eel", "dog"] * 4


def _cfg(train, **files):
    c = data_config()
    c.task = "files"
    c.files.train = str(train)
    c.files.update(files)
    return c


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _csv(path, header, rows, delimiter=","):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter=delimiter)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_tokens_in_every_format_give_the_same_task(tmp_path):
    """Token ids with string labels from JSONL, CSV, TSV and Parquet: vocabulary = largest id
    (9) + 1 + 2 reserved, classes sorted (cat, dog, eel), ids shifted by 2, padded to the
    longest example (7)."""
    rows = [{"inputs": s, "label": y} for s, y in zip(SEQS, LABELS)]
    paths = [
        _jsonl(tmp_path / "t.jsonl", rows),
        _csv(tmp_path / "t.csv", ["inputs", "label"], [[" ".join(map(str, s)), y]
                                                      for s, y in zip(SEQS, LABELS)]),
        _csv(tmp_path / "t.tsv", ["inputs", "label"], [[json.dumps(s), y]
                                                      for s, y in zip(SEQS, LABELS)], "\t"),
    ]
    pq.write_table(pa.table({"inputs": SEQS, "label": LABELS}), tmp_path / "t.parquet",
                   row_group_size=3)
    paths.append(tmp_path / "t.parquet")
    for path in paths:
        c = _cfg(path, validation=str(path), test=str(path))
        assert task_info(c) == dict(name="files", vocab_size=12, num_classes=3, max_length=7,
                                    input_type="tokens", d_input=1, pair=False), path
        src = get_task(c).source("validation")
        ex = src[2]
        np.testing.assert_array_equal(ex["inputs"], np.array([5, 3, 5, 8, 9, 7, 9]) + 2)
        assert ex["label"] == 0 and ex["mask"].all()  # "cat" is class 0
        ex = src[1]
        assert ex["mask"].sum() == 3 and ex["inputs"][3:].tolist() == [0] * 4
        assert src[4]["label"] == 1  # dog


def test_missing_splits_are_carved_from_train_and_recorded(tmp_path):
    pq.write_table(pa.table({"inputs": SEQS * 5, "label": LABELS * 5}), tmp_path / "t.parquet")
    c = _cfg(tmp_path / "t.parquet", holdout_fraction=0.1, holdout_seed=3)
    spec = user_files.infer(c)
    assert spec["holdout"]["rows_each"] == 10 and spec["holdout"]["splits"] == ["validation",
                                                                                 "test"]
    perm = np.random.default_rng(3).permutation(100)
    task = get_task(c)
    assert [task.num_examples(s) for s in ("train", "validation", "test")] == [80, 10, 10]
    np.testing.assert_array_equal(task.source("validation").rows, np.sort(perm[:10]))
    np.testing.assert_array_equal(task.source("test").rows, np.sort(perm[10:20]))
    assert set(task.source("train").rows) == set(range(100)) - set(perm[:20])
    wd = tmp_path / "wd"
    record_spec(c, wd)
    saved = json.loads((wd / "data_spec.json").read_text())
    assert saved["holdout"]["seed"] == 3 and saved["splits"]["test"]["carved_from_train"]


def test_floats_npy_npz_and_jsonl(tmp_path):
    """[rows, length, channels] floats: normalised per channel by the train mean / std, `raw`
    0..255 over the train range, the L1 masked target; labels from `<stem>.label.npy`."""
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, (30, 6, 2))
    y = np.arange(30) % 4
    np.save(tmp_path / "f.npy", x)
    np.save(tmp_path / "f.label.npy", y)
    np.savez(tmp_path / "f.npz", inputs=x, label=y)
    _jsonl(tmp_path / "f.jsonl", [{"inputs": a.tolist(), "label": int(b)} for a, b in zip(x, y)])
    for name in ("f.npy", "f.npz", "f.jsonl"):
        path = tmp_path / name
        c = _cfg(path, validation=str(path), test=str(path))
        info = task_info(c)
        assert info["input_type"] == "continuous" and info["d_input"] == 2, name
        assert info["num_classes"] == 4 and info["max_length"] == 6
        assert info["masked_target"] == "l1"
        ex = get_task(c).source("test")[7]
        flat = x.reshape(-1, 2)
        np.testing.assert_allclose(ex["inputs"], (x[7] - flat.mean(0)) / flat.std(0), rtol=1e-5)
        lo, hi = flat.min(0), flat.max(0)
        np.testing.assert_array_equal(ex["raw"], np.rint((x[7] - lo) * 255 / (hi - lo)))
        assert ex["label"] == 3


def test_text_bytes_and_characters(tmp_path):
    path = _jsonl(tmp_path / "t.jsonl", [{"inputs": s, "label": i % 2}
                                         for i, s in enumerate(["ab", "ba c", "é"] * 4)])
    c = _cfg(path, validation=str(path), test=str(path))
    assert task_info(c)["vocab_size"] == 258 and task_info(c)["max_length"] == 4
    np.testing.assert_array_equal(get_task(c).source("train")[2]["inputs"][:2],
                                  np.frombuffer("é".encode(), np.uint8) + 2)
    c.files.text_vocab = "chars"  # ' ', a, b, c, é -> ids 3..7 (0 pad, 1 mask, 2 unknown)
    assert task_info(c)["vocab_size"] == 8
    np.testing.assert_array_equal(get_task(c).source("train")[1]["inputs"], [5, 4, 3, 6])


def test_text_with_the_users_sentencepiece_model(tmp_path, monkeypatch):
    """`text_vocab=<model file>`: the model's vocabulary + the 2 reserved ids, its ids shifted
    by 2. The optional `sentencepiece` package is stood in for by a word-level model here (the
    calls sptlib makes: SentencePieceProcessor(model_file=...), encode, vocab_size)."""
    import types
    words = {"the": 3, "cat": 4, "sat": 5}

    class Processor:
        def __init__(self, model_file):
            assert model_file == str(tmp_path / "m.model")

        def encode(self, text):
            return [words.get(w, 0) for w in text.split()]

        def vocab_size(self):
            return 8
    monkeypatch.setitem(sys.modules, "sentencepiece",
                        types.SimpleNamespace(SentencePieceProcessor=Processor))
    (tmp_path / "m.model").write_bytes(b"stand-in")
    path = _jsonl(tmp_path / "t.jsonl", [{"inputs": "the cat sat", "label": 0},
                                         {"inputs": "cat", "label": 1}] * 3)
    c = _cfg(path, validation=str(path), test=str(path), text_vocab=str(tmp_path / "m.model"))
    assert task_info(c)["vocab_size"] == 10 and task_info(c)["max_length"] == 3
    np.testing.assert_array_equal(get_task(c).source("test")[0]["inputs"], [5, 6, 7])


def test_longer_than_max_length_is_truncated_and_counted(tmp_path):
    # two classes: a single one is refused (test_repro.py)
    path = _jsonl(tmp_path / "t.jsonl", [{"inputs": s, "label": i % 2}
                                         for i, s in enumerate(SEQS)])
    c = _cfg(path, validation=str(path), test=str(path))
    c.max_length = 4
    task = get_task(c)
    ex = task.source("test")[2]
    np.testing.assert_array_equal(ex["inputs"], np.array([5, 3, 5, 8]) + 2)
    longer = sum(len(s) > 4 for s in SEQS)
    assert task.num_truncated["test"] == longer == user_files.infer(c)["splits"]["test"][
        "truncated"]


def _bad(tmp_path, make, needle, **files):
    """The config fails in the trainer's preflight with one line holding `needle`; no stage
    folder, checkpoint or data spec is written."""
    train = make(tmp_path)
    c = files_experiment.get_config("model=transformer,regime=scratch")
    testing.tiny(c)
    with c.unlocked():
        c.data.files.update(train=str(train), **files)
        c.data.max_length = 0
    wd = tmp_path / "wd"
    with pytest.raises(errors.SptlibError) as e:
        stages.run(c, str(wd))
    line = errors.one_line(e.value)
    assert "\n" not in line and errors.exit_code(e.value) == 2
    for part in needle:
        assert part in line, line
    assert not (wd / "scratch").exists() and not (wd / "data_spec.json").exists()
    return line


def test_ragged_float_arrays(tmp_path):
    rows = [{"inputs": [[0.1, 0.2]] * 3, "label": 0}] * 2 + [
        {"inputs": [[0.1, 0.2], [0.3], [0.5, 0.6]], "label": 1}]
    _bad(tmp_path, lambda t: _jsonl(t / "r.jsonl", rows),
         ["r.jsonl: row 3, column 'inputs': ragged float array"])
    pq.write_table(pa.table({"x": [[[0.0, 1.0]] * 2] * 4 + [[[0.0, 1.0], [2.0]]], "label":
                             [0] * 5}), tmp_path / "r.parquet")
    _bad(tmp_path, lambda t: t / "r.parquet",
         ["r.parquet: row 5, column 'x': ragged float array: position 1 has 1 channels"],
         input_column="x")


def test_missing_or_misspelt_label_column(tmp_path):
    rows = [{"inputs": [1, 2], "labels": 0}] * 4
    _bad(tmp_path, lambda t: _jsonl(t / "m.jsonl", rows),
         ["m.jsonl: row 1: no column 'label'", "did you mean 'labels'?"])
    pq.write_table(pa.table({"inputs": [[1, 2]] * 4, "y": [0] * 4}), tmp_path / "m.parquet")
    _bad(tmp_path, lambda t: t / "m.parquet", ["m.parquet: no column 'lable'", "'inputs', 'y'"],
         label_column="lable")


def test_nan_and_inf_features(tmp_path):
    x = np.ones((5, 4, 2))
    x[3, 2, 1] = np.nan
    np.save(tmp_path / "n.npy", x)
    np.save(tmp_path / "n.label.npy", np.zeros(5, np.int64))
    _bad(tmp_path, lambda t: t / "n.npy",
         ["n.npy: row 4, column 'inputs': non-finite value nan at position 2, channel 1"])
    rows = [{"inputs": [0.5, 1.5], "label": 0}, {"inputs": [0.5, float("inf")], "label": 0}]
    (tmp_path / "i.jsonl").write_text("\n".join(json.dumps(r) for r in rows))  # Infinity
    _bad(tmp_path, lambda t: t / "i.jsonl", ["i.jsonl: row 2, column 'inputs': non-finite "
                                             "value inf at position 1"])


def test_string_label_in_an_integer_column(tmp_path):
    rows = [["1 2 3", 0], ["4 5", 1], ["6", "cat"], ["7 8", 1]]
    _bad(tmp_path, lambda t: _csv(t / "s.csv", ["inputs", "label"], rows),
         ["s.csv: row 3, column 'label': label 'cat' is not an integer"])


def test_empty_split(tmp_path):
    def make(t):
        _csv(t / "empty.csv", ["inputs", "label"], [])
        return _csv(t / "ok.csv", ["inputs", "label"], [["1 2", 0]] * 4)
    _bad(tmp_path, make, ["empty.csv: the validation split holds no rows"],
         validation=str(tmp_path / "empty.csv"))


def test_empty_example(tmp_path):
    rows = [{"inputs": [1, 2], "label": 0}, {"inputs": [], "label": 1}]
    _bad(tmp_path, lambda t: _jsonl(t / "e.jsonl", rows * 3),
         ["e.jsonl: row 2, column 'inputs': empty example (no positions)"])


def test_token_ids_outside_the_declared_vocabulary(tmp_path):
    rows = [{"inputs": [1, 2, 3], "label": 0}, {"inputs": [4, 25, 6], "label": 1}]
    _bad(tmp_path, lambda t: _jsonl(t / "v.jsonl", rows * 3),
         ["v.jsonl: row 2, column 'inputs': token id 25 at position 1 outside the vocabulary "
          "0..19"], vocab_size=20)


def test_unknown_label_in_a_held_out_split(tmp_path):
    _jsonl(tmp_path / "val.jsonl", [{"inputs": [1], "label": "cat"}, {"inputs": [1],
                                                                       "label": "emu"}])
    _bad(tmp_path, lambda t: _jsonl(t / "tr.jsonl", [{"inputs": [1], "label": "cat"}] * 4),
         ["val.jsonl: row 2, column 'label': label 'emu' is not a class of the train file"],
         validation=str(tmp_path / "val.jsonl"))


def test_resume_with_a_vanished_or_changed_split_file(tmp_path):
    """A workdir made with three files: on restart, a deleted test file is named (nothing
    written), and a train file whose data now gives another vocabulary is refused by the
    recorded data_spec.json."""
    for s in ("train", "validation", "test"):
        _jsonl(tmp_path / f"{s}.jsonl", [{"inputs": [1, 2, 3], "label": i % 2}
                                         for i in range(6)])
    c = files_experiment.get_config(f"model=transformer,regime=scratch,"
                                    f"train={tmp_path / 'train.jsonl'},"
                                    f"validation={tmp_path / 'validation.jsonl'},"
                                    f"test={tmp_path / 'test.jsonl'}")
    testing.tiny(c)
    wd = tmp_path / "wd"
    preflight.check(c, str(wd))
    spec = json.loads((wd / "data_spec.json").read_text())
    assert spec["vocab_size"] == 6 and spec["num_classes"] == 2
    (tmp_path / "test.jsonl").unlink()
    with pytest.raises(errors.DataError) as e:
        preflight.check(c, str(wd))
    assert errors.one_line(e.value).endswith(
        f"config.data.files.test={tmp_path / 'test.jsonl'}: no such file")
    _jsonl(tmp_path / "test.jsonl", [{"inputs": [1, 2], "label": 0}] * 2)
    preflight.check(c, str(wd))  # the same model: going on
    _jsonl(tmp_path / "train.jsonl", [{"inputs": [1, 2, 9], "label": i % 2} for i in range(6)])
    with pytest.raises(errors.DataError) as e:
        preflight.check(c, str(wd))
    line = errors.one_line(e.value)
    assert "data_spec.json: the data changed since this workdir was made: vocab_size = 6 " \
           "there, 12 now" in line, line


def test_command_line_bad_file_is_one_line_exit_2(tmp_path):
    """A real `python -m sptlib.main` on a .npy with a NaN: one line on stderr naming file, row
    and column, exit status 2, nothing written in the workdir (no stage folder, spec, results)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    x = np.zeros((6, 5, 2))
    x[4, 1, 0] = np.inf
    np.save(tmp_path / "bad.npy", x)
    np.save(tmp_path / "bad.label.npy", np.arange(6) % 2)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=root)
    env.pop("XLA_FLAGS", None)
    wd = tmp_path / "wd"
    p = subprocess.run([sys.executable, "-m", "sptlib.main",
                        f"--config={root}/experiments/files.py:train={tmp_path / 'bad.npy'}",
                        f"--workdir={wd}"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert lines[-1] == (f"sptlib.main: error: DataError: {tmp_path / 'bad.npy'}: row 5, column "
                         f"'inputs': non-finite value inf at position 1, channel 0"), lines[-1]
    # Nothing but the run's log, which keeps the error for later (no stage folder, spec, results).
    assert not [q for q in wd.rglob("*") if q.name not in (".sptlib.lock", "log.txt")]
    assert "non-finite value inf" in (wd / "log.txt").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tokens", "floats"])
def test_every_compare_regime_runs_on_files(kind, tmp_path):
    """`python -m sptlib.compare` with every regime (scratch, scratch-equal-compute, spt-masked,
    spt-causal, mlpinit) on a Parquet token file or a .npy float file, for a zoo model and the
    user's mixer by import path: the table lists every cell."""
    from sptlib.configs.paper import REGIMES
    rng = np.random.default_rng(0)
    if kind == "tokens":
        seqs = [rng.integers(0, 12, rng.integers(6, 20)).tolist() for _ in range(60)]
        pq.write_table(pa.table({"inputs": seqs, "label": [len(s) % 2 for s in seqs]}),
                       tmp_path / "train.parquet", row_group_size=16)
        train = "train.parquet"
    else:
        np.save(tmp_path / "train.npy", rng.normal(size=(60, 12, 2)))
        np.save(tmp_path / "train.label.npy", np.arange(60) % 2)
        train = "train.npy"
    (tmp_path / "mixers.py").write_text(USER_MIXER)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=root)
    env.pop("XLA_FLAGS", None)
    p = subprocess.run(
        [sys.executable, "-m", "sptlib.compare",
         f"--config={root}/experiments/files.py:train={train},steps=2,pretrain_steps=2,"
         f"d_model=16,n_layers=1,batch=8,eval_every=2", "--workdir=runs",
         "--models=transformer,mixers:Cumulative", f"--regimes={','.join(REGIMES)}"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=3000)
    assert p.returncode == 0, p.stderr[-3000:]
    table = (tmp_path / "runs" / "comparison.md").read_text()
    # The accuracy table has a column per regime and a number in each; the compute table a row.
    assert f"| model | {' | '.join(REGIMES)} |" in table, table
    for model in ("transformer", "mixers:Cumulative"):
        assert re.search(rf"\| {model} \|" + r" [0-9.]+ \(1\) \|" * len(REGIMES), table), table
        for regime in REGIMES:
            assert f"| {model} | {regime} |" in table, (regime, table)


# The user's mixer of the every-regime grid: causal when asked (spt-causal), by a running sum.
USER_MIXER = """
import flax.linen as nn
import jax.numpy as jnp


class Cumulative(nn.Module):
    d_model: int
    causal: bool = False
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x, *, mask=None, deterministic=True):
        y = jnp.cumsum(x, axis=1) if self.causal else jnp.broadcast_to(
            x.sum(axis=1, keepdims=True), x.shape)
        return nn.Dense(self.d_model)(y / x.shape[1])
"""
