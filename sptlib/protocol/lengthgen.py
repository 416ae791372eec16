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
Only classification (and retrieval) stages are evaluated.
"""

from __future__ import annotations

import logging

import ml_collections
from etils import epath

from sptlib import data as data_lib
from sptlib.errors import ConfigError, IncompatibleCheckpointError
from sptlib.train import metrics as metrics_lib, resolve, setup, sharding, transfer

FIXED_LENGTH_TASKS = ("image", "scifar", "pathfinder", "pathx", "pathx256", "fashion_mnist",
                      "lines")


class LengthGeneralizationUnsupported(ConfigError):  # a ValueError, reported in one line
    """The task or model cannot be evaluated at another length (the message says why)."""


def check_supported(config, factor: float) -> None:
    """Raises `LengthGeneralizationUnsupported` (or ValueError for a bad factor) when `config`'s
    task or model cannot be evaluated at `factor` × its training length."""
    if factor <= 0:
        raise ConfigError(f"length factor must be positive, got {factor}")
    task = config.data.task
    if task in FIXED_LENGTH_TASKS:
        raise LengthGeneralizationUnsupported(
            f"task {task!r} has a fixed input length; length generalisation needs a "
            "variable-length task (listops, text, retrieval, speech_commands)")
    if config.model.positions == "learned":
        raise LengthGeneralizationUnsupported(
            f"config.model.positions='learned' has one embedding per training position; a "
            f"{factor:g}x longer input has none for its later positions")


def longer_config(config, factor: float, train_length: int) -> ml_collections.ConfigDict:
    """A copy of `config` whose data and model read `round(factor × train_length)` tokens."""
    check_supported(config, factor)
    c = ml_collections.ConfigDict(config.to_dict())
    c.data.max_length = int(round(factor * train_length))
    c.model.max_length = 0  # re-derived from the data
    return c


def evaluate(config, workdir, factor: float, *, split: str = "test") -> float:
    """Accuracy of the run in `workdir` (made from `config`) on `split` at `factor` × its
    training length.

    Raises:
      LengthGeneralizationUnsupported: the task or model does not allow another length.
      NoCheckpointError: the last stage has no checkpoint.
    """
    stage_name = config.stage_order[-1]
    stage = config.stages[stage_name]
    if stage.objective.kind not in ("classify", "retrieval"):
        raise LengthGeneralizationUnsupported(
            f"stage {stage_name!r} trains {stage.objective.kind!r}, not a classifier")
    check_supported(config, factor)  # before reading any data
    train_task = data_lib.get_task(config.data)
    train_length = int(train_task.info["max_length"])
    long_cfg = longer_config(config, factor, train_length)

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
