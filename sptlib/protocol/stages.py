"""Runs an experiment config's stages in order, each in `workdir/<stage>/`.

`run(config, workdir)` is what `python -m sptlib.main` calls: e.g. `pretrain` (masked SPT) then
`finetune` (`init_from="pretrain"`: the best pretrain checkpoint's backbone, a fresh head), or a
single `scratch` stage. A finished stage (its `results.json` says so) is not run again; an
unfinished one resumes from its latest checkpoint. `workdir/results.json` summarises the stages
(`sptlib.train.results.RunResults`).

One run at a time per workdir: the run holds `workdir/.sptlib.lock` (`sptlib.train.lock`) from
before preflight to the end; a second run into it stops with one line naming the owner. Ctrl-C
(SIGINT) is a stop on request like SIGTERM (`PreemptedError`, exit status 130): inside a stage a
checkpoint of the current step is saved first.
"""

import json
import os
import signal
import time

from absl import logging
from etils import epath
import jax

from sptlib import console
from sptlib import errors
from sptlib import write_errors
from sptlib.errors import PreemptedError, ResultsError
from sptlib.train import config as config_lib
from sptlib.train import lock as lock_lib
from sptlib.train import loop
from sptlib.train import preflight
from sptlib.train import resolve
from sptlib.train import workdir_checks
from sptlib.train import results as results_lib
from sptlib.train.sharding import is_main_process, maybe_initialize_distributed


def _write_summary(workdir, config, summary, wall_time_s, data_info) -> results_lib.RunResults:
    """Writes `workdir/results.json` atomically, keeping the stages an earlier invocation
    summarised and this one did not reach (a failed rerun never clobbers a finished summary);
    an unreadable earlier summary is moved aside to `results.json.bad`, never overwritten."""
    path = workdir / results_lib.RESULTS_FILE
    stages = {}
    try:
        old = results_lib.read_run(workdir)
    except ResultsError:
        logging.warning("%s is unreadable; kept as %s.bad, rebuilt.", path, path.name)
        if is_main_process():
            path.replace(workdir / "results.json.bad")
        old = None
    if old is not None:
        if not summary:  # this invocation has nothing to add (it failed early)
            return old
        stages = dict(old.stages or {})
    stages = {k: v for k, v in stages.items() if k in config.stage_order}
    stages.update(summary)
    out = results_lib.RunResults(
        stage_order=list(config.stage_order), stages=stages,
        complete=all((stages.get(n) or {}).get("status") == "finished"
                     for n in config.stage_order),
        wall_time_s=wall_time_s, data=data_info)
    if is_main_process():
        results_lib.write_json(path, results_lib.sealed(out.to_json()))
    return out


def run(config, workdir) -> dict:
    """Runs `config.stage_order`; returns `{"stages": {name: StageResults}, "summary":
    RunResults}`.

    The summary is also written to `workdir/results.json` (process 0). Raises what a stage raises
    (`NonFiniteLossError`, `PreemptedError`, ...), after the stages before it were summarised.
    """
    config_lib.validate(config)
    maybe_initialize_distributed(config)
    workdir_checks.check_workdir(workdir)
    _refuse_a_comparison_root(workdir)
    lock = lock_lib.WorkdirLock(workdir) if is_main_process() else None
    if lock is not None:
        lock.acquire()  # before anything is written: a busy workdir is one line, nothing touched
    try:
        # The details of this run go to its workdir (sptlib.console): log.txt, log.<i>.txt.
        with console.log_file(workdir, jax.process_index()):
            return _run(config, workdir)
    except KeyboardInterrupt:  # Ctrl-C outside a stage's loop (data, compile, evaluation)
        raise PreemptedError("interrupted (SIGINT) before a checkpoint of the current stage "
                             "could be saved; its last checkpoint is kept. Run the same "
                             "command to resume.", signum=signal.SIGINT) from None
    except errors.SptlibError:
        raise
    except Exception:
        # A SIGTERM's PreemptedError raised inside library code that wraps it (an extension
        # module's import reports "initialization failed"): the stop on request it was.
        _honour_pending_stop()
        raise
    finally:
        if lock is not None:
            lock.release()


def _refuse_a_comparison_root(workdir) -> None:
    """A `sptlib.compare` grid's folder (its `comparison*.json`) is not one run's workdir: the
    stages would land beside the grid's runs and its summary would be taken for theirs."""
    if "://" in str(workdir) or not os.path.isdir(workdir):
        return
    found = sorted(n for n in os.listdir(workdir)
                   if n.startswith("comparison") and n.endswith(".json"))
    if found:
        raise errors.ConfigError(
            f"--workdir={workdir} is a sptlib.compare grid's folder (it holds {found[0]}), not "
            f"one run's: pass a new --workdir, or rerun the grid with sptlib.compare")


def _honour_pending_stop():
    """Raises the PreemptedError of a SIGTERM whose exception was swallowed where Python ran
    the handler (a garbage-collection callback): the request still stops the run."""
    signum = lock_lib.pending_stop()
    if signum is not None:
        raise PreemptedError("stopped on request (SIGTERM) before a checkpoint of the current "
                             "stage could be saved; its last checkpoint is kept. Run the same "
                             "command to resume.", signum=signum)


def _run(config, workdir) -> dict:
    # Every stage's folder is a folder where it exists (the lock's owner writes there); data,
    # model, metrics checked before any step; the data read once, the run resolved once.
    workdir_checks.check_stage_dirs(config, workdir)
    data_info, task = preflight.check(config, workdir)
    resolved = {r.name: r for r in resolve.resolve_run(config, info=task.info)}
    if not is_main_process():
        # Logs (like files) come from process 0; the others report warnings and errors only.
        logging.set_verbosity(logging.WARNING)
    workdir = epath.Path(workdir)
    if is_main_process():
        workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    all_results = {}
    summary = {}
    try:
        for name in config.stage_order:
            _honour_pending_stop()
            kind = config.stages[name].objective.kind
            logging.info("=== stage %s (%s) -> %s", name, kind, workdir / name)
            all_results[name] = loop.train_stage(config, name, workdir, task=task,
                                                 resolved=resolved[name])
            summary[name] = all_results[name].summary(kind)
    except BaseException:
        try:  # the summary of the stages before; never masks the stage's own error
            _write_summary(workdir, config, summary, time.time() - t0, data_info)
        except Exception as e:  # pylint: disable=broad-except  (e.g. the same full disk)
            logging.warning("Could not write %s (%s).", workdir / results_lib.RESULTS_FILE,
                            errors.one_line(write_errors.find_write_error(e) or e))
        raise
    _honour_pending_stop()
    try:
        out = _write_summary(workdir, config, summary, time.time() - t0, data_info)
    except OSError as e:
        raise (write_errors.find_write_error(e) or e) from e
    logging.info("All stages done: %s", json.dumps(summary, default=str))
    return {"stages": all_results, "summary": out}
