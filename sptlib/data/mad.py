"""The MAD synthetic suite, zoology's MQAR and induction heads as per-position labelling probes.

MAD (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures"; tasks as in
athms/mad-lab `mad/data/instances.py`, difficulty axes as in its `configs/tasks/*.yml`):

- `mad_in_context_recall` — `length / 2` key-value pairs, keys drawn with replacement from
  `(vocab_size - noise_vocab) // 2` key tokens, each key's value fixed for the whole sequence
  (drawn once per sequence from the value tokens). Multi-query, as MAD's configs run it: every
  *repeated* key is a query; the answer is the value its earlier occurrences carried. The last
  pair always repeats an earlier key, so every sequence has an answer.
- `mad_noisy_recall` — the same with a fraction `frac_noise` of the pairs replaced by two tokens
  of a separate `noise_vocab` (never queried, never carrying a value).
- `mad_fuzzy_recall` — keys and values are motifs of 1..`motif_size` distinct tokens, a key
  motif's value motif fixed per sequence; a repeated key motif queries every token of its value.
- `mad_selective_copying` — `sptlib.data.probes.selective_copying` with MAD's names.
- `mad_compression` — `length / 2` random tokens, a marker, then the tokens again at the marker
  and the blanks after it. MAD scores compression with an auto-encoder (a decoder reads one
  compressed embedding), which sptlib's backbones have no head for; this causal form keeps what
  it measures for a recurrent model (everything must pass through the state at the marker) but
  lets attention look back, so it is a copying task for attention.
- `mad_memorization` — pairs `key, <insert>`; the answer at `<insert>` is the key's value under
  one fixed key-to-value map shared by every sequence and split (seeded by `kv_map_seed`): the
  facts must be stored in the weights.

MQAR (Arora et al. 2023, *Zoology*; as `multiquery_ar` of HazyResearch/zoology): `num_pairs`
pairs with distinct keys and distinct values, then a query region where each key is queried once,
at `2 * num_pairs + 2 * gap` with the gaps drawn without replacement from p(g) ~ g^(power_a - 1),
g = 1..(length - 2 * num_pairs) / 2 (small `power_a`: queries close to the pairs, as repeated
bigrams in text; 1: uniform). Filler positions are blank (zoology's optional random filler could
draw key tokens, which would be unanswered "queries").

Induction heads (`induction_heads`): random tokens of a `vocab_size` vocabulary, a trigger at a
random position followed by the token to recall, the trigger again at the last position; the
answer there is the token that followed the first trigger.

Every generator returns `probes.py`'s dict: int32 `inputs`, int32 `targets` (answer class at a
scored position, -1 elsewhere) and bool `mask`, each `[num, length]`; the scored position is the
one *before* the answer token in MAD's next-token form (the model has read the key, it must emit
the value), so a causal model is scored exactly where MAD scores it. Training uses only the
scored positions (the `tagging` objective), where MAD trains a language model on every next
token; causal SPT on the probe's own sequences is the regime that adds the rest.

Token ids: sptlib's reserved ids, then `BLANK_ID`, `MARKER_ID` (copy / insert / compression /
trigger), then each task's own tokens from `FIRST_ID` (keys, values, noise in that order).
Generation is vectorised NumPy over blocks of `BLOCK` sequences, block b of a set drawn from its
own stream seeded [seed, b] (held-out splits: [seed, tag, b]), so a set's first examples do not
depend on its size and no split shares a stream with another (as `probes.py`).
"""

from __future__ import annotations

import numpy as np

from sptlib import vocab

BLANK_ID = vocab.NUM_SPECIAL
MARKER_ID = vocab.NUM_SPECIAL + 1
FIRST_ID = vocab.NUM_SPECIAL + 2
BLOCK = 64  # sequences per random stream (vectorised together)


def _generate(num, seed, held_out, length, fill):
    """`num` sequences of `length` from `fill(rng, n, inputs, targets)` over blocks of BLOCK."""
    blocks = -(-num // BLOCK)
    inputs = np.full((blocks * BLOCK, length), BLANK_ID, np.int32)
    targets = np.full((blocks * BLOCK, length), -1, np.int32)
    for b in range(blocks):
        tag = (1_000_003 if held_out is True else int(held_out)) if held_out else None
        rng = np.random.default_rng([seed, tag, b] if tag else [seed, b])
        sl = slice(b * BLOCK, (b + 1) * BLOCK)
        fill(rng, BLOCK, inputs[sl], targets[sl])
    return {"inputs": inputs[:num], "targets": targets[:num],
            "mask": np.ones((num, length), bool)}


def _first_occurrence(ids):
    """bool [n, P]: ids[i, p] does not occur in ids[i, :p] (stable sort, no P x P table)."""
    order = np.argsort(ids, axis=1, kind="stable")
    s = np.take_along_axis(ids, order, axis=1)
    first_sorted = np.ones_like(s, bool)
    first_sorted[:, 1:] = s[:, 1:] != s[:, :-1]
    first = np.empty_like(first_sorted)
    np.put_along_axis(first, order, first_sorted, axis=1)
    return first


def _fail(task, msg):
    raise ValueError(f"{task}: {msg}")


# ------------------------------------------------------------------------------------------------
# In-context recall (plain and noisy).
# ------------------------------------------------------------------------------------------------

def _recall_sizes(task, length, vocab_size, noise_vocab, frac_noise):
    if length < 4 or length % 2:
        _fail(task, f"length {length} must be even and >= 4 (key-value pairs, one repeated)")
    if not 0.0 <= frac_noise < 1.0:
        _fail(task, f"frac_noise {frac_noise} must be in [0, 1)")
    if frac_noise > 0 and noise_vocab < 1:
        _fail(task, f"frac_noise {frac_noise} > 0 needs noise_vocab >= 1, got {noise_vocab}")
    keys = (vocab_size - noise_vocab) // 2
    values = vocab_size - noise_vocab - keys
    if keys < 1 or values < 1:
        _fail(task, f"vocab_size {vocab_size} leaves {keys} key and {values} value tokens after "
                    f"noise_vocab {noise_vocab}; needs at least 2 + noise_vocab")
    return keys, values


def in_context_recall_info(*, length=128, vocab_size=16, noise_vocab=0, frac_noise=0.0,
                           task="mad_in_context_recall"):
    keys, values = _recall_sizes(task, length, vocab_size, noise_vocab, frac_noise)
    return {"vocab_size": FIRST_ID + vocab_size, "num_classes": values, "max_length": length,
            "scored": length // 2}


def in_context_recall(num, *, length=128, vocab_size=16, noise_vocab=0, frac_noise=0.0,
                      seed=0, held_out=False, task="mad_in_context_recall"):
    """MAD's multi-query in-context recall (`frac_noise` > 0: noisy recall). Pair p sits at
    positions (2p, 2p + 1); a repeated key's position is scored with its value's class."""
    K, V = _recall_sizes(task, length, vocab_size, noise_vocab, frac_noise)
    P = length // 2

    def fill(rng, n, inputs, targets):
        rows = np.arange(n)[:, None]
        table = rng.integers(0, V, (n, K))  # each key's value, fixed within a sequence
        keys = rng.integers(0, K, (n, P))
        noise = rng.random((n, P)) < frac_noise
        # One pair before the last is a real pair; the last pair repeats a random real one.
        noise[np.arange(n), rng.integers(0, P - 1, n)] = False
        noise[:, -1] = False
        score = np.where(noise[:, :-1], -1.0, rng.random((n, P - 1)))
        keys[:, -1] = keys[np.arange(n), score.argmax(1)]
        values = table[rows, keys]
        ids = np.where(noise, K + np.arange(P), keys)  # noise pairs: never a repeated key
        scored = ~noise & ~_first_occurrence(ids)
        ks, vs = inputs[:, 0::2], inputs[:, 1::2]
        ks[:] = np.where(noise, FIRST_ID + K + V + rng.integers(0, max(noise_vocab, 1), (n, P)),
                         FIRST_ID + keys)
        vs[:] = np.where(noise, FIRST_ID + K + V + rng.integers(0, max(noise_vocab, 1), (n, P)),
                         FIRST_ID + K + values)
        targets[:, 0::2] = np.where(scored, values, -1)

    return _generate(num, seed, held_out, length, fill)


def noisy_recall_info(*, length=128, vocab_size=32, noise_vocab=16, frac_noise=0.2):
    return in_context_recall_info(length=length, vocab_size=vocab_size, noise_vocab=noise_vocab,
                                  frac_noise=frac_noise, task="mad_noisy_recall")


def noisy_recall(num, *, length=128, vocab_size=32, noise_vocab=16, frac_noise=0.2, seed=0,
                 held_out=False):
    return in_context_recall(num, length=length, vocab_size=vocab_size, noise_vocab=noise_vocab,
                             frac_noise=frac_noise, seed=seed, held_out=held_out,
                             task="mad_noisy_recall")


# ------------------------------------------------------------------------------------------------
# Fuzzy recall: keys and values are motifs of several tokens.
# ------------------------------------------------------------------------------------------------

def fuzzy_recall_info(*, length=128, vocab_size=16, motif_size=3):
    keys = vocab_size // 2
    if motif_size < 1 or keys < motif_size or vocab_size - keys < motif_size:
        _fail("mad_fuzzy_recall", f"vocab_size {vocab_size} gives {keys} key and "
                                  f"{vocab_size - keys} value tokens; motif_size {motif_size} "
                                  "needs at least motif_size of each")
    if length < 4 * motif_size + 2:
        _fail("mad_fuzzy_recall", f"length {length} < 4 * motif_size + 2 = {4 * motif_size + 2} "
                                  "(a pair and its repeat at the largest motifs)")
    return {"vocab_size": FIRST_ID + vocab_size, "num_classes": vocab_size - keys,
            "max_length": length, "scored": motif_size}


def fuzzy_recall(num, *, length=128, vocab_size=16, motif_size=3, seed=0, held_out=False):
    """Key motifs of 1..motif_size distinct key tokens, each followed by its value motif (1..
    motif_size distinct value tokens, fixed per key motif within a sequence); left-padded with
    blanks; the last pair repeats an earlier key. At a repeated key's last token the answer is
    its value's first token, at value token j the value's token j + 1 (every value token is
    predicted from what precedes it). Vectorised over the block: pairs in fixed slots, then
    compacted."""
    fuzzy_recall_info(length=length, vocab_size=vocab_size, motif_size=motif_size)
    K = vocab_size // 2
    V = vocab_size - K
    m = motif_size

    def motifs(rng, n, count, size_max, vocab_n):
        """[n, count, size_max] distinct tokens (-1 past each motif's size) and sizes [n, count]."""
        tok = np.argsort(rng.random((n, count, vocab_n)), axis=2)[:, :, :size_max]
        size = rng.integers(1, size_max + 1, (n, count))
        return np.where(np.arange(size_max) < size[..., None], tok, -1), size

    def fill(rng, n, inputs, targets):
        # Pair slots [n, P, 2m] (key tokens, then value tokens, -1 past each motif), cut to the
        # pairs that fit before the final repeat, then compacted to the right end of the row.
        P = length // 2
        rows = np.arange(n)
        kmot, ksize = motifs(rng, n, P, m, K)
        vmot, vsize = motifs(rng, n, P, m, V)
        # Key identity: the motif as a number (distinct motifs, distinct codes).
        code = ((kmot + 1) * (K + 1) ** np.arange(m)).sum(-1)
        # A key's value: the value motif of its first occurrence (later pairs reuse it); before
        # the lengths are summed, since a reused value has its own length.
        same = (code[:, :, None] == code[:, None, :]) & np.tri(P, dtype=bool)
        first = same.argmax(2)
        vmot, vsize = vmot[rows[:, None], first], vsize[rows[:, None], first]
        cum = np.cumsum(ksize + vsize, axis=1)
        k = np.maximum((cum <= length - 2 * m).sum(1), 1)  # pairs before the repeat
        j = (rng.random(n) * k).astype(int)                  # the pair the last one repeats
        for a in (kmot, vmot, ksize, vsize, code):
            a[rows, k] = a[rows, j]
        keep = np.arange(P) <= k[:, None]
        ids = np.where(keep, code, -1 - np.arange(P))        # dropped pairs: never repeats
        rep = keep & ~_first_occurrence(ids)
        tok = np.concatenate([np.where(kmot >= 0, FIRST_ID + kmot, -1),
                              np.where(vmot >= 0, FIRST_ID + K + vmot, -1)], axis=2)
        tgt = np.full((n, P, 2 * m), -1)
        # Repeated key: its last token answers the value's first token, value token a its a + 1.
        nxt = np.concatenate([vmot, np.full((n, P, 1), -1)], axis=2)
        tgt[rows[:, None], np.arange(P), ksize - 1] = np.where(rep, vmot[..., 0], -1)
        tgt[..., m:] = np.where(rep[..., None] & (np.arange(m) < vsize[..., None] - 1),
                                nxt[..., 1:], -1)
        valid = (tok >= 0) & keep[..., None]
        tok, tgt, valid = tok.reshape(n, -1), tgt.reshape(n, -1), valid.reshape(n, -1)
        r, c = np.nonzero(valid)
        col = length - valid.sum(1)[r] + (np.cumsum(valid, axis=1)[r, c] - 1)
        inputs[r, col] = tok[r, c]
        targets[r, col] = tgt[r, c]
    return _generate(num, seed, held_out, length, fill)


# ------------------------------------------------------------------------------------------------
# Selective copying, compression, memorisation.
# ------------------------------------------------------------------------------------------------

def compression_info(*, length=32, vocab_size=16):
    if length < 2 or length % 2:
        _fail("mad_compression", f"length {length} must be even and >= 2 (tokens, then marker "
                                 "and blanks as long)")
    if vocab_size < 2:
        _fail("mad_compression", f"vocab_size {vocab_size} must be >= 2")
    return {"vocab_size": FIRST_ID + vocab_size, "num_classes": vocab_size,
            "max_length": length, "scored": length // 2}


def compression(num, *, length=32, vocab_size=16, seed=0, held_out=False):
    """`length / 2` tokens, then the marker and blanks; the answers there are the tokens in order."""
    compression_info(length=length, vocab_size=vocab_size)
    m = length // 2

    def fill(rng, n, inputs, targets):
        data = rng.integers(0, vocab_size, (n, m))
        inputs[:, :m] = FIRST_ID + data
        inputs[:, m] = MARKER_ID
        targets[:, m:] = data

    return _generate(num, seed, held_out, length, fill)


def memorization_map(vocab_size, kv_map_seed):
    """The fixed key -> value class map ([vocab_size // 2] ints, distinct) of memorization."""
    keys = vocab_size // 2
    return np.random.default_rng(kv_map_seed).permutation(vocab_size - keys)[:keys]


def memorization_info(*, length=32, vocab_size=256, kv_map_seed=12345):
    if length < 2 or length % 2:
        _fail("mad_memorization", f"length {length} must be even and >= 2 (key, insert pairs)")
    if vocab_size < 2:
        _fail("mad_memorization", f"vocab_size {vocab_size} must be >= 2 (keys and values)")
    return {"vocab_size": FIRST_ID + vocab_size, "num_classes": vocab_size - vocab_size // 2,
            "max_length": length, "scored": length // 2}


def memorization(num, *, length=32, vocab_size=256, kv_map_seed=12345, seed=0, held_out=False):
    """Pairs (key, MARKER); at the marker the answer is the key's value class under
    `memorization_map` (the same in every sequence and split)."""
    memorization_info(length=length, vocab_size=vocab_size, kv_map_seed=kv_map_seed)
    table = memorization_map(vocab_size, kv_map_seed)
    K = vocab_size // 2

    def fill(rng, n, inputs, targets):
        keys = rng.integers(0, K, (n, length // 2))
        inputs[:, 0::2] = FIRST_ID + keys
        inputs[:, 1::2] = MARKER_ID
        targets[:, 1::2] = table[keys]

    return _generate(num, seed, held_out, length, fill)


# ------------------------------------------------------------------------------------------------
# Zoology's MQAR with power-law query placement; induction heads.
# ------------------------------------------------------------------------------------------------

def mqar_info(*, length=64, num_pairs=4, vocab_size=128, power_a=0.01):
    if length % 2:
        _fail("mqar", f"length {length} must be even")
    if num_pairs < 1 or 4 * num_pairs > length:
        _fail("mqar", f"num_pairs {num_pairs} does not fit length {length}: the pairs and their "
                      f"query region need 4 * num_pairs <= length (at most {length // 4})")
    keys = vocab_size // 2
    if min(keys, vocab_size - keys) < num_pairs:
        _fail("mqar", f"vocab_size {vocab_size} gives {keys} keys and {vocab_size - keys} values; "
                      f"num_pairs {num_pairs} distinct of each needs vocab_size >= "
                      f"{2 * num_pairs}")
    if not power_a > 0:
        _fail("mqar", f"power_a {power_a} must be > 0 (1 = uniform query gaps)")
    return {"vocab_size": FIRST_ID + vocab_size, "num_classes": vocab_size - keys,
            "max_length": length, "scored": num_pairs}


def mqar(num, *, length=64, num_pairs=4, vocab_size=128, power_a=0.01, seed=0, held_out=False):
    """Zoology's MQAR: pairs at (2p, 2p + 1), keys and values distinct within a sequence; key p's
    query at `2 * num_pairs + 2 * gap_p`, the gaps distinct, drawn from the power law (Gumbel
    top-k = successive sampling without replacement); the answer is its value's class."""
    mqar_info(length=length, num_pairs=num_pairs, vocab_size=vocab_size, power_a=power_a)
    K = vocab_size // 2
    V = vocab_size - K
    P = num_pairs
    space = (length - 2 * P) // 2
    logp = (power_a - 1.0) * np.log(np.arange(1, space + 1))

    def fill(rng, n, inputs, targets):
        keys = np.argsort(rng.random((n, K)), axis=1)[:, :P]
        values = np.argsort(rng.random((n, V)), axis=1)[:, :P]
        inputs[:, 0:2 * P:2] = FIRST_ID + keys
        inputs[:, 1:2 * P:2] = FIRST_ID + K + values
        gumbel = -np.log(-np.log(rng.random((n, space))))
        gaps = np.argsort(-(logp + gumbel), axis=1)[:, :P]
        pos = 2 * P + 2 * gaps
        np.put_along_axis(inputs, pos, FIRST_ID + keys, axis=1)
        np.put_along_axis(targets, pos, values, axis=1)

    return _generate(num, seed, held_out, length, fill)


def induction_heads_info(*, length=64, vocab_size=16):
    if length < 4:
        _fail("induction_heads", f"length {length} must be >= 4 (trigger, token, trigger)")
    if vocab_size < 2:
        _fail("induction_heads", f"vocab_size {vocab_size} must be >= 2")
    return {"vocab_size": FIRST_ID + vocab_size, "num_classes": vocab_size,
            "max_length": length, "scored": 1}


def induction_heads(num, *, length=64, vocab_size=16, seed=0, held_out=False):
    """Random tokens; the trigger (MARKER_ID) at a random position < length - 2 and again at the
    last position, where the answer is the token after the first trigger."""
    induction_heads_info(length=length, vocab_size=vocab_size)

    def fill(rng, n, inputs, targets):
        data = rng.integers(0, vocab_size, (n, length))
        inputs[:] = FIRST_ID + data
        at = rng.integers(0, length - 2, n)
        inputs[np.arange(n), at] = MARKER_ID
        inputs[:, -1] = MARKER_ID
        targets[:, -1] = data[np.arange(n), at + 1]

    return _generate(num, seed, held_out, length, fill)


GENERATORS = {
    "mad_in_context_recall": (in_context_recall, in_context_recall_info),
    "mad_noisy_recall": (noisy_recall, noisy_recall_info),
    "mad_fuzzy_recall": (fuzzy_recall, fuzzy_recall_info),
    "mad_compression": (compression, compression_info),
    "mad_memorization": (memorization, memorization_info),
    "mqar": (mqar, mqar_info),
    "induction_heads": (induction_heads, induction_heads_info),
}
# mad_selective_copying is sptlib.data.probes.selective_copying under MAD's names; probes registers
# it (it imports this module, so this one cannot import it back).
MAD_TASKS = ("mad_in_context_recall", "mad_noisy_recall", "mad_fuzzy_recall",
             "mad_selective_copying", "mad_compression", "mad_memorization")
PROBES = MAD_TASKS + ("mqar", "induction_heads")

# config.data.probes fields each probe reads (its length is config.data.max_length); the field
# `vocab_size` is MAD's (the task's own tokens; keys, values and noise for the recalls).
OPTION_FIELDS = {
    "mad_in_context_recall": ("vocab_size", "noise_vocab", "frac_noise"),
    "mad_noisy_recall": ("vocab_size", "noise_vocab", "frac_noise"),
    "mad_fuzzy_recall": ("vocab_size", "motif_size"),
    "mad_selective_copying": ("vocab_size", "num_tokens"),
    "mad_compression": ("vocab_size",),
    "mad_memorization": ("vocab_size", "kv_map_seed"),
    "mqar": ("num_pairs", "vocab_size", "power_a"),
    "induction_heads": ("vocab_size",),
}
FLOAT_FIELDS = ("frac_noise", "power_a")

# MAD's difficulty sweeps (configs/tasks/*.yml of athms/mad-lab): a baseline and, per axis, the
# values each changed alone (lengths: `length`; `num_train`: training sequences).
MAD_SETTINGS = {
    "mad_in_context_recall": (dict(vocab_size=16, length=128, num_train=12800),
                              dict(vocab_size=(32, 64, 128), length=(256, 512, 1024),
                                   num_train=(6400, 3200, 1600, 800))),
    "mad_noisy_recall": (dict(vocab_size=32, noise_vocab=16, length=128, num_train=12800,
                              frac_noise=0.2),
                         dict(vocab_size=(48, 80, 144), length=(256, 512, 1024),
                              num_train=(6400, 3200, 1600, 800), frac_noise=(0.4, 0.6, 0.8))),
    "mad_fuzzy_recall": (dict(vocab_size=16, length=128, num_train=12800, motif_size=3),
                         dict(vocab_size=(32, 64, 128), length=(256, 512, 1024),
                              num_train=(6400, 3200, 1600, 800))),
    "mad_selective_copying": (dict(vocab_size=16, length=256, num_tokens=16, num_train=12800),
                              dict(vocab_size=(32, 64, 128), length=(512, 1024),
                                   num_train=(6400, 3200, 1600, 800),
                                   num_tokens=(32, 64, 96))),
    "mad_compression": (dict(vocab_size=16, length=32, num_train=12800),
                        dict(vocab_size=(32, 64, 128), length=(64, 128, 256),
                             num_train=(6400, 3200, 1600, 800))),
    "mad_memorization": (dict(vocab_size=256, length=32, num_train=256),
                         dict(vocab_size=(512, 1024, 2048, 4096, 8192))),
}


def mad_settings(task):
    """MAD's settings of `task`: the baseline first, then each axis value changed alone
    ([{axis: value, ...}], each a full setting)."""
    base, changes = MAD_SETTINGS[task]
    out = [dict(base)]
    for axis, values in changes.items():
        out += [dict(base, **{axis: v}) for v in values]
    return out


def mad_score(accuracies):
    """MAD's aggregate: per task the mean test accuracy over its settings (each setting's best
    run over the lr / weight-decay sweep), then the mean over tasks.

    accuracies: {task: [accuracy of each setting]} -> (score, {task: task score})."""
    per_task = {t: float(np.mean(v)) for t, v in accuracies.items() if len(v)}
    if not per_task:
        raise ValueError("mad_score: no task has a setting with an accuracy")
    return float(np.mean(list(per_task.values()))), per_task
