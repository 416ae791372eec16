"""ListOps: the LRA generator (exact algorithm) and the reader of the release TSV files.

Release layout: `<lra_dir>/listops-1000/basic_{train,val,test}.tsv`, tab-separated, header
`Source\tTarget`, e.g. `( ( ( [MAX 2 ) 9 ) ] )\t9`.

The generator follows google-research/long-range-arena `lra_benchmarks/data/listops.py`: a tree is
a leaf (a digit) with probability 0.75 or at the maximum depth, otherwise an operator among MIN,
MAX, MED (int of the median), SM (sum mod 10) with 2..max_args arguments; its length counts
operators, digits and `]` (not parentheses); trees with min_length < length < max_length are kept,
duplicates removed. Unlike the original (a Python `set`, whose order depends on the hash seed),
first-seen order is kept so the same seed writes identical files.
"""

import csv
import logging
import os
import random

import numpy as np

from sptlib.data import tokenizers
from sptlib.data.errors import DataError, decode_line, int_label, located
from sptlib.data.release import check_count, write_atomically
from sptlib.errors import ConfigError

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
VALUE_P = 0.25  # probability of an operator node below the maximum depth
SPLIT_FILES = {"train": "basic_train.tsv", "validation": "basic_val.tsv",
               "test": "basic_test.tsv"}
FOLDER = "listops-1000"
# Consecutive draws without a new distinct example after which generation gives up: the window
# holds fewer distinct trees than asked (a real window's gaps are a few hundred draws at most).
STALL_DRAWS = 50_000


class _TooLong(Exception):
    pass


def _generate_tree(rng, depth, max_depth, max_args, budget):
    """Returns (tree, length); a tree is an int leaf or (operator, [subtrees]).

    `budget[0]` counts the tokens still allowed; a tree that would reach the upper length bound is
    abandoned (`_TooLong`) instead of being finished and rejected. It would be rejected anyway, so
    the accepted trees keep the LRA distribution while generation gets much faster.
    """
    r = rng.random() if depth < max_depth else 1.0
    if r > VALUE_P:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooLong
        return rng.randrange(10), 1
    num_args = rng.randint(2, max_args)
    length = 2  # the operator and its closing `]`
    budget[0] -= 2
    if budget[0] < 0:
        raise _TooLong
    args = []
    for _ in range(num_args):
        sub, sub_len = _generate_tree(rng, depth + 1, max_depth, max_args, budget)
        args.append(sub)
        length += sub_len
    return (rng.choice(OPERATORS), args), length


def _to_string(tree):
    """LRA's string form: left-nested binary tuples, each wrapped in parentheses."""
    if isinstance(tree, int):
        return str(tree)
    op, args = tree
    s = f"( {op} {_to_string(args[0])} )"
    for a in args[1:]:
        s = f"( {s} {_to_string(a)} )"
    return f"( {s} {END} )"


def _key(tree):
    return tree if isinstance(tree, int) else (tree[0], tuple(_key(a) for a in tree[1]))


def evaluate(tree):
    """Exact value of a tree (MED = int of the median, SM = sum mod 10)."""
    if isinstance(tree, int):
        return tree
    op, args = tree
    vals = [evaluate(a) for a in args]
    if op == "[MIN":
        return min(vals)
    if op == "[MAX":
        return max(vals)
    if op == "[SM":
        return sum(vals) % 10
    vals.sort()
    n = len(vals)
    # int(np.median(...)) of non-negative values: floor of the mean of the middle pair.
    return vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) // 2


def generate(num_examples, *, seed=0, min_length=500, max_length=2000, max_depth=10, max_args=10,
             progress=False):
    """Generates `num_examples` distinct (source, label) pairs with min_length < len < max_length.

    Returns a list of (source string, int label) in generation order.
    """
    if max_length - max(min_length, 0) < 2:  # lengths are >= 1 and strictly inside the bounds
        raise ConfigError(f"ListOps length window min_length={min_length} < length < "
                          f"max_length={max_length} is empty (--min_length/--max_length, "
                          f"config.data.generate.*); widen it")
    rng = random.Random(seed)
    seen = {}
    bar = _progress(num_examples, "listops", progress)
    stalled = 0
    while len(seen) < num_examples:
        stalled += 1
        if stalled > STALL_DRAWS:
            bar.close()
            raise ConfigError(
                f"ListOps: only {len(seen)} distinct examples with {min_length} < length < "
                f"{max_length} after {STALL_DRAWS} draws without a new one, {num_examples} asked; "
                f"widen the window (--min_length/--max_length) or ask for fewer examples")
        try:
            tree, length = _generate_tree(rng, 1, max_depth, max_args, [max_length - 1])
        except _TooLong:
            continue
        if min_length < length < max_length:
            key = _key(tree)
            if key not in seen:
                seen[key] = tree
                stalled = 0
                bar.update(1)
    bar.close()
    return [(_to_string(t), evaluate(t)) for t in seen.values()]


def write_split(path, examples):
    """Writes a release-format TSV (header `Source\tTarget`)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["Source", "Target"])
        w.writerows(examples)


def generate_release(out_dir, *, num_train, num_val, num_test, seed=0, min_length=500,
                     max_length=2000, progress=False):
    """Writes `out_dir/listops-1000/basic_{train,val,test}.tsv`; returns that folder.

    The files are written in a temporary folder and moved into place only when all three are
    complete, so a killed generation leaves nothing a later run could trust."""
    for name, n in (("num_train", num_train), ("num_val", num_val), ("num_test", num_test)):
        check_count(name, n, 1)
    examples = generate(num_train + num_val + num_test, seed=seed, min_length=min_length,
                        max_length=max_length, progress=progress)
    splits = {"train": examples[:num_train],
              "validation": examples[num_train:num_train + num_val],
              "test": examples[num_train + num_val:]}

    def write(tmp):
        for split, rows in splits.items():
            write_split(os.path.join(tmp, SPLIT_FILES[split]), rows)

    return write_atomically(os.path.join(out_dir, FOLDER), write)


def split_path(lra_dir, split):
    return os.path.join(lra_dir, FOLDER, SPLIT_FILES[split])


def read_split(path):
    """Parses a ListOps TSV -> (list of int32 token arrays, int32 labels [n]).

    Errors name the file and line: wrong column count, non-integer or out-of-range label,
    unknown symbol, bytes that are not UTF-8, missing file. A UTF-8 byte-order mark is skipped.
    """
    if not os.path.exists(path):
        raise DataError(f"{path}: ListOps split file not found")
    tokens, labels = [], []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            line = decode_line(raw, path, lineno)
            if lineno == 1 and line.startswith("Source"):
                continue
            if not line.strip():
                continue
            cols = line.split("\t")
            if len(cols) != 2:
                raise located(path, lineno, f"expected 2 tab-separated columns (Source, Target), "
                                            f"got {len(cols)}")
            label = int_label(cols[1], path, lineno, 10)
            try:
                tokens.append(tokenizers.listops_tokens(cols[0]))
            except KeyError as e:
                raise located(path, lineno, f"unknown ListOps symbol {e.args[0]!r}") from None
            src = cols[0]
            if src.count("(") != src.count(")") or src.count("[") != src.count("]"):
                raise located(path, lineno, f"unbalanced expression ({src.count('(')} '(' vs "
                                            f"{src.count(')')} ')', {src.count('[')} operators "
                                            f"vs {src.count(']')} ']')")
            labels.append(label)
    logging.info("ListOps: read %d examples from %s", len(labels), path)
    return tokens, np.asarray(labels, dtype=np.int32)


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _progress(total, desc, enabled):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="ex")
