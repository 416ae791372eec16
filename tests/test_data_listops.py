"""ListOps generator, release-format reader, bad-input errors and the ListOps task."""

import os

import numpy as np
import pytest

from sptlib.data import data_config, get_task, listops, tokenizers
from sptlib.data.__main__ import main as cli_main
from sptlib.data.errors import DataError


def naive_listops_value(source):
    """Independent evaluator: a stack machine over the release string (parentheses ignored)."""
    stack = []
    for tok in source.split():
        if tok in ("(", ")"):
            continue
        if tok.startswith("["):
            stack.append(tok)
        elif tok == "]":
            args = []
            while not isinstance(stack[-1], str):
                args.append(stack.pop())
            op = stack.pop()
            if op == "[MIN":
                v = min(args)
            elif op == "[MAX":
                v = max(args)
            elif op == "[SM":
                v = sum(args) % 10
            else:
                v = int(np.median(args))
            stack.append(v)
        else:
            stack.append(int(tok))
    assert len(stack) == 1
    return stack[0]


def read_tsv(path):
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0] == "Source\tTarget"
    return [(l.split("\t")[0], int(l.split("\t")[1])) for l in lines[1:]]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("lra")
    assert cli_main(["listops", "--out", str(out), "--num_train", "400", "--num_val", "50",
                     "--num_test", "50", "--seed", "3", "--min_length", "30",
                     "--max_length", "150", "--no_progress"]) == 0
    return out


def test_generator_labels_lengths_and_duplicates(generated):
    folder = generated / "listops-1000"
    splits = {s: read_tsv(folder / f"basic_{s}.tsv") for s in ("train", "val", "test")}
    assert [len(v) for v in splits.values()] == [400, 50, 50]
    sources = [src for rows in splits.values() for src, _ in rows]
    assert len(set(sources)) == len(sources)  # no duplicates within or across splits
    labels = []
    for rows in splits.values():
        for src, label in rows:
            assert naive_listops_value(src) == label
            n = sum(t not in ("(", ")") for t in src.split())
            assert 30 < n < 150
            labels.append(label)
    # Every class occurs, and operators of all four kinds appear.
    assert set(labels) == set(range(10))
    joined = " ".join(sources)
    assert all(op in joined for op in listops.OPERATORS)


def test_generator_is_seed_deterministic(tmp_path):
    a = listops.generate(30, seed=5, min_length=20, max_length=80)
    b = listops.generate(30, seed=5, min_length=20, max_length=80)
    c = listops.generate(30, seed=6, min_length=20, max_length=80)
    assert a == b and a != c


def test_evaluate_medians_and_sum_mod():
    # Hand-computed: MED of [1, 2, 8, 9] is int(5.0) = 5; of [1, 4] int(2.5) = 2; SM 7+8 = 5.
    assert listops.evaluate(("[MED", [1, 2, 8, 9])) == 5
    assert listops.evaluate(("[MED", [4, 1])) == 2
    assert listops.evaluate(("[SM", [7, 8])) == 5
    assert listops._to_string(("[MAX", [2, 9])) == "( ( ( [MAX 2 ) 9 ) ] )"


def test_reader_release_format(tmp_path):
    path = tmp_path / "basic_train.tsv"
    path.write_text("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n"
                    "( ( ( ( [SM 3 ) ( ( ( [MIN 4 ) 1 ) ] ) ) 8 ) ] )\t2\n")
    seqs, labels = listops.read_split(str(path))
    ids = tokenizers.LISTOPS_IDS
    assert labels.tolist() == [9, 2]
    assert seqs[0].tolist() == [ids["[MAX"], ids["2"], ids["9"], ids["]"]]
    assert len(seqs[1]) == 8  # [SM 3 [MIN 4 1 ] 8 ]
    assert min(int(s.min()) for s in seqs) >= 2  # 0 and 1 are reserved


@pytest.mark.parametrize("row,needle", [
    ("( ( [MAX 2 ) ] )\t9\textra", "expected 2 tab-separated columns"),
    ("( ( [MAX 2 ) ] )\tnine", "not an integer"),
    ("( ( [MAX 2 ) ] )\t12", "outside 0..9"),
    ("( ( [FOO 2 ) ] )\t2", "unknown ListOps symbol"),
])
def test_reader_bad_rows_name_file_and_line(tmp_path, row, needle):
    path = tmp_path / "basic_train.tsv"
    path.write_text("Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n" + row + "\n")
    with pytest.raises(DataError, match=needle) as e:
        listops.read_split(str(path))
    assert f"{path}:3:" in str(e.value)


def test_missing_split_file_and_missing_lra_dir(tmp_path, generated):
    with pytest.raises(DataError, match="basic_val.tsv: ListOps split file not found"):
        listops.read_split(str(tmp_path / "basic_val.tsv"))
    cfg = data_config()
    cfg.lra_dir = str(tmp_path / "nowhere")
    with pytest.raises(DataError) as e:
        get_task(cfg)
    msg = str(e.value)
    assert "listops-1000/basic_train.tsv" in msg and "nowhere" in msg
    assert "lra_release" in msg and "python -m sptlib.data listops" in msg
    # A present train file but missing test split: the error names the missing file.
    partial = tmp_path / "partial"
    (partial / "listops-1000").mkdir(parents=True)
    os.link(generated / "listops-1000" / "basic_train.tsv",
            partial / "listops-1000" / "basic_train.tsv")
    cfg.lra_dir = str(partial)
    task = get_task(cfg)
    with pytest.raises(DataError, match="basic_test.tsv"):
        task.make_iterator("test", batch_size=2, seed=0, num_epochs=1)


def test_task_batches_and_truncation(generated):
    cfg = data_config()
    cfg.lra_dir = str(generated)
    cfg.max_length = 100
    task = get_task(cfg)
    assert task.info["vocab_size"] == 17 and task.info["num_classes"] == 10
    rows = read_tsv(generated / "listops-1000" / "basic_val.tsv")
    batches = list(task.make_iterator("validation", batch_size=16, seed=0, num_epochs=1,
                                      drop_remainder=False))
    assert len(batches) == 4  # 50 examples -> 3 full batches + 1 padded with 14 fillers
    b = {k: np.concatenate([x[k] for x in batches]) for k in batches[0]}
    assert b["inputs"].shape == (64, 100) and b["inputs"].dtype == np.int32
    assert b["example_mask"].tolist() == [True] * 50 + [False] * 14
    assert b["label"][:50].tolist() == [y for _, y in rows]
    lengths = [min(100, sum(t not in ("(", ")") for t in s.split())) for s, _ in rows]
    assert b["mask"][:50].sum(1).tolist() == lengths
    assert not b["mask"][50:].any() and (b["inputs"][~b["mask"]] == 0).all()
    expected_trunc = sum(sum(t not in ("(", ")") for t in s.split()) > 100 for s, _ in rows)
    assert task.num_truncated["validation"] == expected_trunc > 0


def test_generate_on_demand(tmp_path):
    cfg = data_config()
    cfg.lra_dir = str(tmp_path / "gen")
    cfg.generate.update(enabled=True, num_train=20, num_val=5, num_test=5, min_length=10,
                        max_length=40)
    task = get_task(cfg)
    assert task.num_examples("train") == 20 and task.num_examples("test") == 5
