"""Language-model evaluation past the training length (GSS paper, section 4: train at L, test
zero-shot at 2L … 16L), and the compiled FLOPs of a training step (for equal-compute columns).

`evaluate(config, workdir, factors)` loads the best-validation checkpoint of the run's causal LM
stage into the same model built for windows of `factor × L` tokens and scores the test text:

  * the same text at every factor: only the first `k · max(factors) · L` test tokens are read
    (`data.lm.eval_tokens`), cut into non-overlapping windows of `factor · L`, so every factor
    predicts (nearly) the same tokens — a longer window only gives them more context;
  * next-token cross-entropy in bits (bits per byte for the byte tokeniser), padding excluded,
    overall and per position bucket [0, L), [L, 2L), [2L, 4L), … inside the window;
  * SSMs run in convolution form (their kernels are computed for any length); attention runs
    through the exact chunked kernel (`attention.impl='chunked'`), which never forms the
    `[length, length]` score matrix;
  * positions: sinusoidal and rotary positions are functions of the index and extrapolate (to
    positions never seen in training); `positions='learned'` has no embedding past L and is
    refused by `sptlib.protocol.lengthgen.check_supported` with a clear error.

Results are cached in `<run workdir>/lm_eval.json`; `sptlib.protocol.compare` stores them in the run's
record under `lm` and `sptlib.protocol.lmreport` turns them into the table and `length_generalisation.png`.
"""

from __future__ import annotations

import json
import logging
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from etils import epath

from sptlib import data as data_lib
from sptlib.protocol import lengthgen
from sptlib.train import results as results_lib
from sptlib.train import setup
from sptlib.train import transfer

CACHE_FILE = "lm_eval.json"
# How `train_step_flops` counts (bumped when that changes, so cached results are recounted).
FLOPS_COUNT = "unrolled-v1"
FACTORS = (1, 2, 4, 8, 16)


def _lm_stage(config) -> str:
    name = config.stage_order[-1]
    if config.stages[name].objective.kind != "causal":
        raise lengthgen.LengthGeneralizationUnsupported(
            f"stage {name!r} trains {config.stages[name].objective.kind!r}, not a causal LM")
    return name


def bucket_edges(length: int, train_length: int) -> list[int]:
    """Bucket boundaries 0, L, 2L, 4L, … (clipped to `length`) of positions in a window."""
    edges, e = [0], train_length
    while e < length:
        edges.append(e)
        e *= 2
    return edges + [length]


def per_position_bits(apply_fn, variables, objective, inputs, mask):
    """Summed next-token cross-entropy (bits) and counts per position over the batch.

    Args:
      inputs: int `[batch, length]`; mask: bool `[batch, length]` (False = padding/filler).

    Returns:
      `(bits [length - 1], count [length - 1])`: position t predicts token t + 1 and counts when
      both are real (the causal objective's rule).
    """
    logits = apply_fn(variables, objective.model_inputs(inputs), mask, deterministic=True)
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, inputs[:, 1:, None], axis=-1)[..., 0] / math.log(2.0)
    w = (mask[:, :-1] & mask[:, 1:]).astype(jnp.float32)
    return jnp.sum(nll * w, axis=0), jnp.sum(w, axis=0)


def _eval_config(config, factor, train_length, eval_tokens):
    """`config` at windows of factor × L over the first `eval_tokens` held-out tokens."""
    c = lengthgen.longer_config(config, factor, train_length)  # refuses learned positions
    c.data.lm.eval_tokens = int(eval_tokens)
    if c.model.mixer == "attention" or c.model.pattern == "gss_hybrid":
        c.model.attention.impl = "chunked"  # exact; memory O(length · chunk), not O(length²)
    return c


def _restore(config, stage_name, workdir, task, example):
    """(model, objective, variables) of the stage's best checkpoint, built for `task` by the
    trainer's own set-up (evaluation only)."""
    built = setup.build_stage(config, stage_name, example_batch=example, info=task.info,
                              train=False)
    best = transfer.resolve_init_checkpoint(stage_name, epath.Path(workdir), "best")
    params, model_state, _ = transfer.load_pretrained(best, built.state.params,
                                                      built.state.model_state)
    return built.model, built.objective, {"params": params, **model_state}, str(best)


def evaluate_factor(config, workdir, factor, train_length, eval_tokens, *, split="test",
                    tokens_per_batch=16384) -> dict:
    """Bits per token of the run's best checkpoint at windows of `factor × train_length`."""
    stage_name = _lm_stage(config)
    c = _eval_config(config, factor, train_length, eval_tokens)
    task = data_lib.get_task(c.data)
    length = int(task.info["max_length"])
    batch_size = max(1, tokens_per_batch // length)
    it = task.make_iterator(split, batch_size=batch_size, seed=0, num_epochs=1,
                            drop_remainder=False)
    state0 = it.get_state()
    example = next(it)
    it.set_state(state0)
    model, objective, variables, ckpt = _restore(c, stage_name, workdir, task, example)
    fn = jax.jit(lambda v, x, m: per_position_bits(model.apply, v, objective, x, m))
    bits = np.zeros(length - 1)
    count = np.zeros(length - 1)
    for batch in it:
        b, n = fn(variables, jnp.asarray(batch["inputs"]),
                  jnp.asarray(batch["mask"]) & jnp.asarray(batch["example_mask"])[:, None])
        bits += np.asarray(b, np.float64)
        count += np.asarray(n, np.float64)
    edges = bucket_edges(length - 1, train_length)
    buckets = {}
    for lo, hi in zip(edges[:-1], edges[1:]):
        if count[lo:hi].sum():
            buckets[f"{lo}-{hi}"] = float(bits[lo:hi].sum() / count[lo:hi].sum())
    out = {"factor": float(factor), "length": length,
           "bits_per_token": float(bits.sum() / max(count.sum(), 1.0)),
           "predictions": int(count.sum()), "buckets": buckets, "checkpoint": ckpt}
    logging.info("LM eval x%g (%d tokens/window): %.4f bits/token over %d predictions", factor,
                 length, out["bits_per_token"], out["predictions"])
    return out


def train_step_flops(config, stage_name=None) -> float | None:
    """XLA's FLOP count of one compiled training step of the stage (forward, backward and the
    optimiser update, at the training batch and length), or None when the backend reports none.

    Counted with the layers unrolled (`scan_layers=False`): XLA's cost analysis counts the body
    of a loop once, so a scanned stack of n layers would report about one layer's FLOPs.
    """
    stage_name = stage_name or config.stage_order[-1]
    config = ml_collections.ConfigDict(config.to_dict())
    config.model.scan_layers = False
    task = data_lib.get_task(config.data)
    # The trainer's set-up, abstract: nothing is allocated, only compiled.
    built = setup.build_stage(config, stage_name, info=task.info, abstract=True)
    with jax.set_mesh(built.mesh):
        compiled = built.train_step.jitted.lower(built.state, built.example_batch).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = (cost or {}).get("flops")
    return float(flops) if flops else None


def evaluate(config, workdir, factors=FACTORS, *, split="test") -> dict:
    """Length generalisation of the run in `workdir` (see the module docstring).

    The text is the first k windows of `max(factors) × L` tokens of `split`: as many as fit in
    `data.lm.eval_tokens` (0 = the whole split).

    Args:
      factors: multiples of the training length.

    Returns:
      `{"train_length", "eval_tokens", "factors": {"1x": evaluate_factor(...), ...},
      "train_step_flops", "errors": {"16x": "why"}}`; a factor that cannot run (e.g. learned
      positions) is reported in `errors`, not raised.
    """
    _lm_stage(config)
    train_task = data_lib.get_task(config.data)
    train_length = int(train_task.info["max_length"])
    longest = int(round(max(factors) * train_length))
    # The split's text, already cut at data.lm.eval_tokens, in windows of L.
    k = (len(train_task.source(split)) * train_length) // longest
    if k < 1:
        raise ValueError(f"the {split} text holds {len(train_task.source(split)) * train_length} "
                         f"tokens, less "
                         f"than one window of {max(factors):g} x {train_length} = {longest}: "
                         "raise data.lm.max_bytes / data.lm.eval_tokens or lower the factors")
    out = {"train_length": train_length, "eval_tokens": k * longest, "split": split,
           "factors": {}, "errors": {}}
    for f in factors:
        key = f"{f:g}x"
        try:
            out["factors"][key] = evaluate_factor(config, workdir, f, train_length, k * longest,
                                                  split=split)
        except lengthgen.LengthGeneralizationUnsupported as e:
            out["errors"][key] = str(e)
    out["train_step_flops"] = _flops_or_none(config)
    out["flops_count"] = FLOPS_COUNT
    return out


def _flops_or_none(config):
    try:
        return train_step_flops(config)
    except Exception as e:  # pylint: disable=broad-except
        logging.warning("train-step FLOPs unavailable: %s", e)
        return None


def evaluate_cached(config, workdir, factors=FACTORS, **kwargs) -> dict:
    """`evaluate`, read from / written to `<workdir>/lm_eval.json`."""
    path = epath.Path(workdir) / CACHE_FILE
    if path.exists():
        cached = json.loads(path.read_text())
        if set(cached.get("factors", {})) | set(cached.get("errors", {})) == \
                {f"{f:g}x" for f in factors}:
            if cached.get("flops_count") != FLOPS_COUNT:  # an older count: redo that part only
                cached["train_step_flops"] = _flops_or_none(config)
                cached["flops_count"] = FLOPS_COUNT
                results_lib.write_text(path, json.dumps(cached, indent=1))
            return cached
    out = evaluate(config, workdir, factors, **kwargs)
    results_lib.write_text(path, json.dumps(out, indent=1))
    return out
