"""Length generalisation: test a finished classifier on inputs `factor` times its training length.

`sptlib.protocol.compare` calls `evaluate(config, run_workdir, factor)` for every finished run when
`config.compare.length_factors` (or `--length_factors`) is set; the accuracies land in the run's
`length_generalization` record ({"2x": acc, "4x": acc}).

How: the best-validation checkpoint of the run's last stage is loaded into the same model built
for `max_length = factor × L_train`, and the test split is read with that `max_length`, so inputs
that training truncated at L_train are now seen up to factor × L_train. What allows it:
  - tasks whose examples have variable length (listops, text, retrieval, speech_commands):
    image tasks have a fixed length (R × R pixels) and raise `LengthGeneralizationUnsupported`;
  - models without a length-sized parameter: SSM kernels are computed for any length and
    sinusoidal/rotary/no positions extend; learned absolute positions do not (raises).
Classification and retrieval stages are evaluated, and the per-position probes
(`sptlib.data.probes`: associative recall, selective copying, the MAD tasks, MQAR, induction
heads) trained with the `tagging` objective: their generator draws the test split afresh at the
longer length (same seed and stream, so factor 1 is the run's own test set), with `options`
replacing probe settings for a slice (e.g. {"num_pairs": 32}: zoology's per-`num_kv_pairs`
slices). A probe whose length is fixed by its other settings (`PROBE_FIXED_LENGTH`) is refused.
"""

from __future__ import annotations

import logging

import ml_collections
from etils import epath

from sptlib import data as data_lib
from sptlib.data import probes as probes_lib
from sptlib.errors import ConfigError, IncompatibleCheckpointError
from sptlib.train import metrics as metrics_lib, resolve, setup, sharding, transfer

FIXED_LENGTH_TASKS = ("image", "scifar", "pathfinder", "pathx", "pathx256", "fashion_mnist",
                      "lines")
# Probes whose longer version is another task: memorisation sees more facts per sequence (no
# longer context to extrapolate over) and compression copies more tokens.
PROBE_FIXED_LENGTH = ("mad_memorization", "mad_compression")


class LengthGeneralizationUnsupported(ConfigError):  # a ValueError, reported in one line
    """The task or model cannot be evaluated at another length (the message says why)."""


def check_supported(config, factor: float) -> None:
    """Raises `LengthGeneralizationUnsupported` (or ValueError for a bad factor) when `config`'s
    task or model cannot be evaluated at `factor` × its training length."""
    if factor <= 0:
        raise ConfigError(f"length factor must be positive, got {factor}")
    task = config.data.task
    if task in PROBE_FIXED_LENGTH:
        raise LengthGeneralizationUnsupported(
            f"probe {task!r}: a longer sequence is a different task (more facts / tokens to "
            "copy), not the same task over a longer context")
    if task in FIXED_LENGTH_TASKS:
        raise LengthGeneralizationUnsupported(
            f"task {task!r} has a fixed input length; length generalisation needs a "
            "variable-length task (listops, text, retrieval, speech_commands)")
    if config.model.positions == "learned":
        raise LengthGeneralizationUnsupported(
            f"config.model.positions='learned' has one embedding per training position; a "
            f"{factor:g}x longer input has none for its later positions")


def longer_config(config, factor: float, train_length: int,
                  options: dict | None = None) -> ml_collections.ConfigDict:
    """A copy of `config` whose data and model read `round(factor × train_length)` tokens
    (`options`: `config.data.probes` fields replaced, a probe's slice)."""
    check_supported(config, factor)
    c = ml_collections.ConfigDict(config.to_dict())
    c.data.max_length = int(round(factor * train_length))
    c.model.max_length = 0  # re-derived from the data
    if options:
        unknown = sorted(set(options) - set(c.data.probes))
        if unknown:
            raise ConfigError(f"length slice options {unknown} are not config.data.probes fields")
        c.data.probes.update(dict(options))
    return c


def evaluate(config, workdir, factor: float, *, split: str = "test",
             options: dict | None = None) -> float:
    """Accuracy of the run in `workdir` (made from `config`) on `split` at `factor` × its
    training length (`options`: a probe slice's settings, see `longer_config`).

    Raises:
      LengthGeneralizationUnsupported: the task or model does not allow another length.
      NoCheckpointError: the last stage has no checkpoint.
    """
    stage_name = config.stage_order[-1]
    stage = config.stages[stage_name]
    kind = stage.objective.kind
    probe = config.data.task in probes_lib.PROBES
    if not (kind in ("classify", "retrieval") or kind == "tagging" and probe):
        raise LengthGeneralizationUnsupported(
            f"stage {stage_name!r} trains {kind!r}, not a classifier or a probe's tagging")
    if options and not probe:
        raise ConfigError(f"length slice options {sorted(options)} need a probe task, not "
                          f"{config.data.task!r}")
    check_supported(config, factor)  # before reading any data
    train_task = data_lib.get_task(config.data)
    train_length = int(train_task.info["max_length"])
    long_cfg = longer_config(config, factor, train_length, options)

    task = data_lib.get_task(long_cfg.data)
    resolved = resolve.resolve_stage(long_cfg, stage_name, info=task.info)
    it = task.make_iterator(split, batch_size=resolved.eval_batch_size, seed=0, num_epochs=1,
                            drop_remainder=False)

    # A fresh state at the new length, then the trained tensors by name (a shape that depends on
    # the length would fail here with the parameter's name).
    built = setup.build_stage(long_cfg, stage_name, example_batch=setup.peek(it),
                              train=False, resolved=resolved)
    state, mesh, rules = built.state, built.mesh, built.rules
    step_dir = transfer.resolve_init_checkpoint(stage_name, epath.Path(workdir), "best")
    try:
        params, model_state, _ = transfer.load_pretrained(step_dir, state.params,
                                                          state.model_state)
    except IncompatibleCheckpointError as e:
        raise LengthGeneralizationUnsupported(
            f"the model has a length-sized parameter: {e}") from e
    state = state.replace(params=params, model_state=model_state)
    acc = None
    for batch in it:
        acc = metrics_lib.accumulate(
            acc, built.eval_step(state, sharding.shard_batch(batch, mesh, rules)))
    result = metrics_lib.summarize(acc)
    logging.info("length x%g (%d tokens) on %s: %s", factor, long_cfg.data.max_length, split,
                 metrics_lib.format_metrics(result))
    return float(result["accuracy"])


def parse_slice(text: str) -> dict:
    """'num_pairs=32' or 'num_pairs=32;vocab_size=256' -> {field: int | float}."""
    out = {}
    for part in filter(None, str(text).split(";")):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"length slice {text!r}: expected field=value[;field=value]")
        v = float(value)
        out[key.strip()] = int(v) if v.is_integer() and "." not in value else v
    return out


def slice_results(config, workdir, slices, factors, *, evaluate_fn=None, cached_only=False,
                  log=logging.info) -> dict:
    """{"<slice> @<f>x": accuracy} of a finished probe run for every slice of `slices` (e.g.
    "num_pairs=32") and factor of `factors` (1 included: the slice at the training length),
    cached per key in the run's `length_slices.json` (a refused key is logged and retried next
    time, never stored). `cached_only`: read the cache, compute nothing (report-only)."""
    import json

    evaluate_fn = evaluate_fn or evaluate
    cache = epath.Path(workdir) / "length_slices.json"
    done = {}
    if cache.exists():
        try:
            done = {k: float(v) for k, v in json.loads(cache.read_text()).items()}
        except (ValueError, TypeError, AttributeError):
            log(f"[lengthgen] {cache} is unreadable; recomputing it")
    factors = sorted({1.0, *(float(f) for f in factors)})
    wanted = [(s, f, f"{s} @{f:g}x") for s in slices for f in factors]
    new = False
    for s, f, key in wanted:
        if key in done or cached_only:
            continue
        try:
            done[key] = float(evaluate_fn(config, workdir, f, options=parse_slice(s)))
            new = True
        except Exception as e:  # a slice the generator or model cannot run: say so, go on
            log(f"[lengthgen] {key} for {workdir} skipped: {e}")
    if new:
        cache.write_text(json.dumps(done, indent=1))
    return {key: done[key] for _, _, key in wanted if key in done}
