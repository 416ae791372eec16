"""Synthetic probes that separate selective (input-dependent) models from LTI ones.

- `associative_recall` — multi-query associative recall (MQAR; Arora et al. 2023, *Zoology*):
  `num_pairs` key–value pairs `k_1 v_1 … k_P v_P`, then a query region where every key appears
  once as a query, at random positions among blank tokens. At a query position the answer is
  the value that followed that key. Keys are distinct within a sequence, values may repeat,
  and the pairing is fresh in every sequence, so the answer can only come from the context.
- `selective_copying` — the Mamba paper's selective copying (Gu & Dao 2023, §4.1.1):
  `num_tokens` data tokens scattered at random positions of a context of blank (noise) tokens,
  then `num_tokens` copy markers; at the j-th marker the answer is the j-th data token.
  An LTI filter cannot do this for random spacing (the offsets to remember change from sequence
  to sequence); attention and selective SSMs can.

Both are per-position labelling tasks: `targets[b, t]` is the answer class at a scored position
and -1 elsewhere (`scored = targets >= 0`). Token ids keep sptlib's reserved ids (`<pad>` = 0,
`<mask>` = 1, `sptlib.vocab`); every sequence has the full length (`mask` all True).

Pure NumPy and deterministic: example i of a set is drawn from its own stream seeded
[seed, i] (held-out sets: [seed, tag, i], `SPLIT_TAGS`), so a set's first examples do not depend
on its size and no held-out example is drawn from a training stream. The tasks built on them
(`sptlib.data.probe_tasks`) draw train, validation and test from three such streams.
"""

import numpy as np

from sptlib import vocab
from sptlib.data import mad

HELD_OUT_TAG = 1_000_003
VALIDATION_TAG = 1_000_033
# Stream tag of each split of the probe tasks: test is the held-out stream of
# experiments/selective.py, so both score the same sequences at one seed.
SPLIT_TAGS = {"train": None, "validation": VALIDATION_TAG, "test": HELD_OUT_TAG}
BLANK_ID = vocab.NUM_SPECIAL      # filler / noise token
MARKER_ID = vocab.NUM_SPECIAL + 1  # copy marker (selective copying)
FIRST_ID = vocab.NUM_SPECIAL + 2   # first key / data token
PROBES = ("associative_recall", "selective_copying")


def _stream(seed, i, held_out):
    """held_out: False (training stream), True (HELD_OUT_TAG) or a tag (SPLIT_TAGS)."""
    if held_out is True:
        held_out = HELD_OUT_TAG
    return np.random.default_rng([seed, int(held_out), i] if held_out else [seed, i])


def associative_recall_info(*, num_pairs=16, length=128, key_vocab=64, value_vocab=64,
                            num_queries=0):
    """{vocab_size, num_classes, max_length, scored} of `associative_recall` (checks sizes)."""
    q = num_queries or num_pairs
    if key_vocab < num_pairs:
        raise ValueError(f"associative_recall: key_vocab {key_vocab} < num_pairs {num_pairs}")
    if q > num_pairs:
        raise ValueError(f"associative_recall: num_queries {q} > num_pairs {num_pairs}")
    if 2 * num_pairs + q > length:
        raise ValueError(f"associative_recall: {num_pairs} pairs and {q} queries do not fit "
                         f"length {length}")
    return {"vocab_size": FIRST_ID + key_vocab + value_vocab, "num_classes": value_vocab,
            "max_length": length, "scored": q}


def associative_recall(num, *, num_pairs=16, length=128, key_vocab=64, value_vocab=64,
                       num_queries=0, seed=0, held_out=False):
    """`num` MQAR sequences: dict of int32 `inputs`, int32 `targets` (value class or -1) and
    bool `mask`, each `[num, length]`.

    Token ids: blank `BLANK_ID`, keys `FIRST_ID + [0, key_vocab)`, values
    `FIRST_ID + key_vocab + [0, value_vocab)`; the target class is the value's index.
    `num_queries` (0 = num_pairs) distinct keys are queried, each once.
    """
    info = associative_recall_info(num_pairs=num_pairs, length=length, key_vocab=key_vocab,
                                   value_vocab=value_vocab, num_queries=num_queries)
    q = info["scored"]
    inputs = np.full((num, length), BLANK_ID, np.int32)
    targets = np.full((num, length), -1, np.int32)
    region = length - 2 * num_pairs
    for i in range(num):
        rng = _stream(seed, i, held_out)
        keys = rng.choice(key_vocab, num_pairs, replace=False)
        values = rng.integers(0, value_vocab, num_pairs)
        inputs[i, 0:2 * num_pairs:2] = FIRST_ID + keys
        inputs[i, 1:2 * num_pairs:2] = FIRST_ID + key_vocab + values
        which = rng.choice(num_pairs, q, replace=False)
        pos = 2 * num_pairs + np.sort(rng.choice(region, q, replace=False))
        inputs[i, pos] = FIRST_ID + keys[which]
        targets[i, pos] = values[which]
    return {"inputs": inputs, "targets": targets, "mask": np.ones((num, length), bool)}


def selective_copying_info(*, length=256, num_tokens=16, data_vocab=16):
    """{vocab_size, num_classes, max_length, scored} of `selective_copying` (checks sizes)."""
    if 2 * num_tokens > length:
        raise ValueError(f"selective_copying: {num_tokens} tokens and markers do not fit "
                         f"length {length}")
    return {"vocab_size": FIRST_ID + data_vocab, "num_classes": data_vocab,
            "max_length": length, "scored": num_tokens}


def selective_copying(num, *, length=256, num_tokens=16, data_vocab=16, seed=0,
                      held_out=False):
    """`num` selective-copying sequences of total `length`: a context of `length - num_tokens`
    positions holding `num_tokens` data tokens (ids `FIRST_ID + [0, data_vocab)`, drawn with
    replacement) at random positions among blanks, then `num_tokens` markers. Same dict as
    `associative_recall`; the targets sit at the markers, in the data tokens' order."""
    selective_copying_info(length=length, num_tokens=num_tokens, data_vocab=data_vocab)
    context = length - num_tokens
    inputs = np.full((num, length), BLANK_ID, np.int32)
    targets = np.full((num, length), -1, np.int32)
    inputs[:, context:] = MARKER_ID
    for i in range(num):
        rng = _stream(seed, i, held_out)
        data = rng.integers(0, data_vocab, num_tokens)
        pos = np.sort(rng.choice(context, num_tokens, replace=False))
        inputs[i, pos] = FIRST_ID + data
        targets[i, context:] = data
    return {"inputs": inputs, "targets": targets, "mask": np.ones((num, length), bool)}


GENERATORS = {"associative_recall": (associative_recall, associative_recall_info),
              "selective_copying": (selective_copying, selective_copying_info)}
# The MAD suite, zoology's MQAR and induction heads (sptlib/data/mad.py) join the same registry.
GENERATORS.update(mad.GENERATORS)


def mad_selective_copying_info(*, length=256, vocab_size=16, num_tokens=16):
    """`selective_copying_info` under MAD's option names (`vocab_size` the data tokens)."""
    if num_tokens < 1 or 2 * num_tokens > length:
        raise ValueError(f"mad_selective_copying: num_tokens {num_tokens} does not fit length "
                         f"{length}: tokens and their markers need 2 * num_tokens <= length")
    return selective_copying_info(length=length, num_tokens=num_tokens, data_vocab=vocab_size)


def mad_selective_copying(num, *, length=256, vocab_size=16, num_tokens=16, seed=0,
                          held_out=False):
    """MAD's selective copying: `selective_copying` with `vocab_size` data tokens."""
    return selective_copying(num, length=length, num_tokens=num_tokens, data_vocab=vocab_size,
                             seed=seed, held_out=held_out)


GENERATORS["mad_selective_copying"] = (mad_selective_copying, mad_selective_copying_info)
PROBES = PROBES + mad.PROBES


def _check(name):
    if name not in GENERATORS:
        raise ValueError(f"unknown probe {name!r}; known: {PROBES}")


def generate(name, num, *, seed=0, held_out=False, **options):
    """`num` examples of probe `name` (PROBES) with its `options`; `held_out`: False (the
    training stream), True (HELD_OUT_TAG) or a stream tag (SPLIT_TAGS)."""
    _check(name)
    return GENERATORS[name][0](num, seed=seed, held_out=held_out, **options)


def info(name, **options):
    """The probe's sizes: {vocab_size, num_classes, max_length, scored}."""
    _check(name)
    return GENERATORS[name][1](**options)


# config.data.probes fields each probe reads (its length is config.data.max_length).
OPTION_FIELDS = {"associative_recall": ("num_pairs", "key_vocab", "value_vocab", "num_queries"),
                 "selective_copying": ("num_tokens", "data_vocab"), **mad.OPTION_FIELDS}


def options_from(name, probes_cfg, length):
    """Keyword options of probe `name` from `config.data.probes` and the sequence length."""
    _check(name)
    return dict({k: (float if k in mad.FLOAT_FIELDS else int)(probes_cfg[k])
                 for k in OPTION_FIELDS[name]}, length=int(length))
