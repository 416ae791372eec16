"""Runs an experiment config's stages in order, each in `workdir/<stage>/`.

`run(config, workdir)` is what `python -m sptlib.main` calls: e.g. `pretrain` (masked SPT) then
`finetune` (`init_from="pretrain"`: the best pretrain checkpoint's backbone, a fresh head), or a
single `scratch` stage. A finished stage (its `results.json` says so) is not run again; an
unfinished one resumes from its latest checkpoint. `workdir/results.json` summarises the stages.
"""

import json
import time

from absl import logging
from etils import epath

from sptlib.train import config as config_lib
from sptlib.train import loop
from sptlib.train import sharding
from sptlib.train import steps

SUMMARY_KEYS = ("status", "final_step", "best_step", "best_metric", "params_fingerprint",
                "wall_time_s", "init")


def _summary_metric(results, split, which, metric):
    return (results.get(split, {}).get(which, {}) or {}).get(metric)


def run(config, workdir) -> dict:
    """Runs `config.stage_order`; returns `{"stages": {name: results}, "summary": ...}`.

    Also writes it to `workdir/results.json` (process 0). Raises what a stage raises
    (`NonFiniteLossError`, `PreemptedError`, ...), after the stages before it were summarised.
    """
    config_lib.validate(config)
    sharding.maybe_initialize_distributed(config)
    if not steps.is_main_process():
        # Logs (like files) come from process 0; the others report warnings and errors only.
        logging.set_verbosity(logging.WARNING)
    workdir = epath.Path(workdir)
    if steps.is_main_process():
        workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    all_results = {}
    summary = {}
    try:
        for name in config.stage_order:
            logging.info("=== stage %s (%s) -> %s", name, config.stages[name].objective.kind,
                         workdir / name)
            res = loop.train_stage(config, name, workdir)
            all_results[name] = res
            metric = res.get("best_metric")
            summary[name] = {k: res.get(k) for k in SUMMARY_KEYS}
            summary[name].update({
                "objective": config.stages[name].objective.kind,
                f"validation_{metric}_best": _summary_metric(res, "validation", "best", metric),
                f"test_{metric}_best": _summary_metric(res, "test", "best", metric),
                f"test_{metric}_last": _summary_metric(res, "test", "last", metric),
            })
    finally:
        out = {"stage_order": list(config.stage_order), "stages": summary,
               "complete": len(summary) == len(config.stage_order),
               "wall_time_s": time.time() - t0}
        if steps.is_main_process():
            path = workdir / "results.json"
            path.write_text(json.dumps(out, indent=2, sort_keys=True, default=str))
    logging.info("All stages done: %s", json.dumps(summary, default=str))
    return {"stages": all_results, "summary": out}
