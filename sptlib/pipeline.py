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
from sptlib.train import preflight
from sptlib.train import sharding
from sptlib.train import steps

SUMMARY_KEYS = ("status", "final_step", "best_step", "best_metric", "params_fingerprint",
                "wall_time_s", "init")


def _summary_metric(results, split, which, metric):
    return (results.get(split, {}).get(which, {}) or {}).get(metric)


def _write_summary(workdir, config, summary, wall_time_s, data_info) -> dict:
    """Writes `workdir/results.json` atomically, keeping the stages an earlier invocation
    summarised and this one did not reach (a failed rerun never clobbers a finished summary);
    an unreadable earlier summary is moved aside to `results.json.bad`, never overwritten."""
    path = workdir / "results.json"
    stages = {}
    if path.exists():
        try:
            old = json.loads(path.read_text())
            if not summary:  # this invocation has nothing to add (it failed early)
                return old
            stages = dict(old.get("stages") or {})
        except (ValueError, AttributeError):
            logging.warning("%s is unreadable; kept as %s.bad, rebuilt.", path, path.name)
            if steps.is_main_process():
                path.replace(workdir / "results.json.bad")
    stages = {k: v for k, v in stages.items() if k in config.stage_order}
    stages.update(summary)
    out = {"stage_order": list(config.stage_order), "stages": stages,
           "complete": all((stages.get(n) or {}).get("status") == "finished"
                           for n in config.stage_order),
           "wall_time_s": wall_time_s,
           # Examples per split, and the counted skips: truncated at max_length, empty images.
           "data": data_info}
    if steps.is_main_process():
        tmp = workdir / "results.json.tmp"
        tmp.write_text(json.dumps(out, indent=2, sort_keys=True, default=str))
        tmp.replace(path)  # atomic where the file system allows
    return out


def run(config, workdir) -> dict:
    """Runs `config.stage_order`; returns `{"stages": {name: results}, "summary": ...}`.

    Also writes it to `workdir/results.json` (process 0). Raises what a stage raises
    (`NonFiniteLossError`, `PreemptedError`, ...), after the stages before it were summarised.
    """
    config_lib.validate(config)
    sharding.maybe_initialize_distributed(config)
    data_info = preflight.check(config, workdir)  # data, metrics, batches: before any step
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
        out = _write_summary(workdir, config, summary, time.time() - t0, data_info)
    logging.info("All stages done: %s", json.dumps(summary, default=str))
    return {"stages": all_results, "summary": out}
