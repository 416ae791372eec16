r"""The fair-comparison protocol in one command: models × regimes × seeds → table and plots.

    python -m sptlib.compare --config=experiments/quickstart.py --workdir=/tmp/qs
    spt-compare --config=experiments/lra.py:image,s4 --workdir=gs://.../image [--config.x=y]

The experiment config names the grid in its `compare` section (`models`, `regimes`, `seeds`,
`data_fractions`, `length_factors`, `lrs`: the lr axis, `sptlib.protocol.sweeps`). Every cell is a
complete single-run config made by calling the experiment file's `get_config` again with
`model=<m>,regime=<r>` added to its argument (see `sptlib.configs.common`), then setting `seed`
and `data.data_fraction` (`sptlib.protocol.grid.expand`); `--config.a.b=v` overrides apply to every run. Regimes:

  scratch                classification from random init;
  scratch-equal-compute  the same, for pretrain + finetune steps (a control the paper omits);
                         with stages trained to convergence and `compare.equal_compute =
                         "spent"`, for the steps its seed's SPT run spent (`equal_compute`);
  spt-masked             masked-denoising self-pretraining, then finetuning from its best
                         checkpoint with the head re-initialised (same finetune budget as scratch);
  spt-causal             the same with next-token prediction on a causal backbone;
  mlpinit                the model with its mixers bypassed first, then finetuned with fresh mixers.
Control models (`bow`) run under scratch only; their other cells are left out.

Each run goes to `DIR/<model>/<regime>[-frac<f>]/seed<k>/` through `sptlib.protocol.stages.run`. A run
whose `results.json` says it finished is skipped, so an interrupted comparison re-run with the same
command finishes only the missing runs (an unfinished run resumes from its own checkpoints).
Afterwards `DIR/comparison.json` (one record per run), `DIR/comparison.md` and the plots are
written (`sptlib.protocol.report`) and their paths printed.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from typing import Callable, Sequence

from absl import flags, logging
from etils import epath
import ml_collections
from ml_collections import config_flags

from sptlib import console
from sptlib.protocol import compare_display as display
from sptlib.protocol import compare_jobs
from sptlib.protocol import equal_compute
from sptlib.protocol.grid import RunSpec, expand, run_dir  # noqa: F401 (re-exported)
from sptlib.protocol.compare_jobs import parse_shard, shard_specs  # noqa: F401 (re-exported)
from sptlib import errors
from sptlib.protocol import lmreport
from sptlib import logs
from sptlib.protocol import report
from sptlib.protocol import sweeps
from sptlib.configs import presets
from sptlib.protocol.records import is_finished, load_results, make_record
from sptlib.train import results as results_lib
from sptlib.protocol.compare_flags import (  # noqa: F401 (the flags live there)
    _CONFIG, _DRY_RUN, _JOBS, _LIST_OVERRIDES, _OVERRIDE, _RAND_INIT, _REPORT_ONLY, _SHARD,
    _SHARD_DEFERRED, _VERBOSE, _WORKDIR)

REGIMES = presets.REGIMES

# ------------------------------------------------------------------------------------------------
# Running.
# ------------------------------------------------------------------------------------------------

def run_comparison(specs: Sequence[RunSpec], workdir: str, *,
                   run_fn: Callable[[ml_collections.ConfigDict, str], dict] | None = None,
                   title: str = "Comparison", length_factors: Sequence[float] = (),
                   length_eval_fn: Callable | None = None, report_only: bool = False,
                   shard: tuple[int, int] | None = None, deferred_only: bool = False,
                   log: Callable[[str], None] = logging.info) -> tuple[list[dict], dict]:
    """Runs every spec not yet finished, then writes comparison.json / .md and plots.

    Args:
      specs: from `expand`.
      workdir: root of the comparison (comparison.json etc. land here).
      run_fn: `run_fn(config, run_workdir) -> results` (default `sptlib.protocol.stages.run`); injected
        by tests.
      length_factors: evaluate finished classifiers at these multiples of the training length.
      length_eval_fn: `fn(config, run_workdir, factor) -> accuracy | None` (default
        `sptlib.protocol.lengthgen.evaluate` where available).
      report_only: run nothing; report what is finished.
      shard: (i, n): run only shard i of n (`shard_specs`; an SPT cell's lrs in one shard) and
        write their records to `comparison.shard<i>of<n>.json` (no table: other shards may
        still be running). `deferred_only`: split only the deferred seeds whose lr sweep has
        finished (`compare_jobs.run_rounds`).
      log: the details (`logging.info`: the log file, stderr with --verbose); a line per run
        this call trains is also printed on stdout (`sptlib.console.result`).

    Returns:
      (records, {name: path of the written report files}).
    """
    if run_fn is None:
        from sptlib.protocol import stages  # deferred: importing the trainer pulls in JAX
        run_fn = stages.run
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    # A shard runs its share of the grid (`--jobs`'s second round: of the deferred seeds whose
    # sweep finished), but it chooses lrs and shares pretraining stages over the whole grid.
    mine = specs if shard is None else shard_specs(
        [s for s in specs if not deferred_only or sweeps.deferred(s) and not sweeps.deferred(
            sweeps.resolve(s, specs, _val_accuracy))], shard, group=equal_compute.group,
        cost=sweeps.steps)
    json_name = ("comparison.json" if shard is None
                 else f"comparison.shard{shard[0]}of{shard[1]}.json")
    records = []
    todo = [s for s in mine if not _finished(_resolve(s, specs))]
    log(f"[compare] {len(mine)} runs, {len(mine) - len(todo)} already finished, "
        f"{0 if report_only else len(todo)} to run")
    done = 0
    for spec in mine:
        # Resolved again at its turn: the runs before it may have finished its lr sweep.
        spec = _resolve(spec, specs)
        rec = _record_without_running(spec, report_only)
        if rec is None:
            done += 1
            where = f"({done}/{len(todo)}) {spec.name}"
            log(f"[compare] {where} -> {spec.workdir}")
            rec = _run_one(spec, specs, run_fn, log, where,
                           on_stop=lambda: _write_json(records, workdir, json_name))
            console.result(display.run_line(done, len(todo), spec.name, rec))
        _add_extras(rec, spec, length_factors, length_eval_fn, report_only, log)
        records.append(rec)
        _write_json(records, workdir, json_name)  # partial progress is visible while running
    _write_json(records, workdir, json_name)
    if shard is not None:
        return records, {"json": os.path.join(workdir, json_name)}
    paths = report.write_report(records, workdir, title)
    paths["json"] = os.path.join(workdir, json_name)
    return records, paths


def _resolve(spec, specs):
    """`spec` with its lr chosen on validation (`sweeps`) and, for equal compute matched to a
    converged SPT run, its step budget (`equal_compute`), as far as finished runs allow."""
    return equal_compute.resolve(sweeps.resolve(spec, specs, _val_accuracy), specs,
                                 _val_accuracy, _read_stage)


def _read_stage(directory):
    try:
        return results_lib.read_stage(directory)
    except (OSError, errors.ResultsError):
        return None


def _finished(spec) -> bool:
    return is_finished(spec.workdir, spec.config.stage_order)


def _val_accuracy(spec) -> float | None:
    """A finished run's validation accuracy (the lr sweep's only input), else None."""
    if not _finished(spec):
        return None
    return make_record(spec, load_results(spec.workdir), status="finished").get("val_accuracy")


def _record_without_running(spec, report_only):
    """The record of a run that is not to run now (finished, waiting, or a report), else None."""
    if _finished(spec):
        return make_record(spec, load_results(spec.workdir), status="finished")
    if sweeps.deferred(spec):
        return make_record(spec, None, status="missing", error="its lr sweep (seeds "
                           f"{','.join(map(str, spec.lr_seeds))}) is not finished or not in "
                           "--seeds")
    if equal_compute.waiting(spec) and not report_only:
        return make_record(spec, None, status="missing", error="its SPT run (the steps it "
                           "matches) is not finished")
    if report_only:
        return make_record(spec, load_results(spec.workdir), status="missing")
    return None


def _run_one(spec, specs, run_fn, log, where, on_stop) -> dict:
    """Runs one cell; its record. A stop on request writes the records so far (`on_stop`) and
    stops the comparison; any other error is that cell's record, so the others still run."""
    epath.Path(spec.workdir).mkdir(parents=True, exist_ok=True)
    if sweeps.share_pretrain(spec, specs, is_finished):
        log(f"[compare] {spec.name}: pretrain shared with another lr's run")
    t0 = time.time()
    try:
        with console.task(where):  # its stages' progress bars say which run
            run_fn(spec.config, spec.workdir)
        status = "finished" if _finished(spec) else "unfinished"
        return make_record(spec, load_results(spec.workdir), status=status,
                           wall_time_s=time.time() - t0)
    except KeyboardInterrupt:
        raise
    except errors.PreemptedError:
        console.close_bars()
        # SIGTERM / preemption: the stage saved a checkpoint; stop the whole comparison
        # (rerunning the command resumes it) instead of moving on.
        on_stop()
        log(f"[compare] stopped on request during {spec.name}; rerun to resume")
        raise
    except errors.WorkdirBusyError as e:
        # Another live process trains this run (sptlib.train.lock): leave it alone.
        return make_record(spec, load_results(spec.workdir), status="unfinished",
                           error=errors.one_line(e), wall_time_s=time.time() - t0)
    except Exception as e:
        # Any other error: one broken cell must not lose the others. The traceback is in its
        # error.txt and its log.txt; stderr gets one line.
        console.close_bars()
        logging.error("[compare] run %s failed: %s (traceback: %s)", spec.name,
                      errors.one_line(e), os.path.join(spec.workdir, "error.txt"))
        rec = make_record(spec, load_results(spec.workdir), status="failed",
                          error=f"{type(e).__name__}: {e}", wall_time_s=time.time() - t0)
        results_lib.write_text(os.path.join(spec.workdir, "error.txt"), traceback.format_exc())
        return rec


def _add_extras(rec, spec, length_factors, length_eval_fn, report_only, log) -> None:
    """The lr a cell ran at, and its evaluation past the training length (when asked)."""
    if spec.lr is not None:
        rec["lr"], rec["lr_sweep"] = spec.lr, not spec.lr_from
    if length_factors and rec["status"] == "finished" and lmreport.is_lm(spec.config):
        # Causal LMs: bits per token at each factor on the same text (sptlib.protocol.lmeval).
        rec["lm"] = lmreport.lm_record(spec.config, spec.workdir, length_factors,
                                       evaluate=not report_only, log=log)
    elif length_factors and rec["status"] == "finished":
        # --report_only: the factors already cached, nothing evaluated.
        rec["length_generalization"] = _length_eval(spec, length_factors, length_eval_fn, log,
                                                    cached_only=report_only)
    slices = tuple(spec.config.compare.get("length_slices", ()) or ())
    if slices and rec["status"] == "finished":
        # Probes: accuracy per slice (e.g. num_pairs=32) at 1x and each factor (lengthgen).
        from sptlib.protocol import lengthgen  # deferred: pulls in JAX
        rec["length_slices"] = lengthgen.slice_results(
            spec.config, spec.workdir, slices, length_factors, cached_only=report_only, log=log)


def _length_eval(spec, factors, fn, log, cached_only=False) -> dict:
    """{"<f>x": accuracy} for every factor the run allows, cached in the run's
    `length_generalization.json` per factor: a later call computes only the factors it lacks, and
    an empty result is never written (a refused factor is retried, not remembered as done)."""
    cache = epath.Path(spec.workdir) / "length_generalization.json"
    done = {}
    if cache.exists():
        try:
            done = {k: float(v) for k, v in json.loads(cache.read_text()).items()}
        except (ValueError, TypeError, AttributeError):
            log(f"[compare] {cache} is unreadable; recomputing it")
    wanted = {f"{factor:g}x": factor for factor in factors}
    missing = [] if cached_only else [f for k, f in wanted.items() if k not in done]
    if missing and fn is None:
        from sptlib.protocol import lengthgen  # deferred: pulls in JAX
        fn = lengthgen.evaluate
    for factor in missing:
        try:
            acc = fn(spec.config, spec.workdir, factor)
        except Exception as e:  # a model or task that cannot run longer inputs
            log(f"[compare] length x{factor:g} for {spec.name} skipped: {e}")
            acc = None
        if acc is not None:
            done[f"{factor:g}x"] = float(acc)
    if done and missing:
        _write_json(done, spec.workdir, cache.name)
    return {k: v for k, v in done.items() if k in wanted}


def _write_json(records, workdir, name="comparison.json"):
    # Readers (a report, another shard) never see a half-written file.
    results_lib.write_json(epath.Path(workdir) / name, records, indent=1, sort_keys=False)


def parse_numbers(flag: str, values, kind=float, *, low=None, high=None, low_open=False):
    """`--flag=a,b` values as `kind`, each checked against (low, high]; errors name the flag."""
    if values is None:
        return None
    out = []
    for v in values:
        try:
            x = kind(v)
        except ValueError:
            raise errors.ConfigError(f"--{flag}={','.join(values)}: {v!r} is not "
                                     f"{'an integer' if kind is int else 'a number'}") from None
        if (kind is float and not math.isfinite(x)) or (low is not None and (
                x < low or (low_open and x == low))) or (high is not None and x > high):
            bound = f"{'>' if low_open else '>='} {low:g}" if high is None else \
                f"in ({low:g}, {high:g}]"
            raise errors.ConfigError(f"--{flag}={','.join(values)}: {v!r} must be {bound}")
        out.append(x)
    if not out:
        raise errors.ConfigError(f"--{flag}= is empty; give at least one value")
    return out


def main(argv):
    console.setup("sptlib.compare", verbose=_VERBOSE.value, stage_results=False,
                  results=not compare_jobs.is_worker())  # --jobs' parent reports its workers
    try:
        if len(argv) > 1:
            raise errors.ConfigError(f"unexpected arguments {argv[1:]}: every input is a --flag")
        logs.quiet_library_logs()
        return _main()
    except errors.SptlibError as e:
        console.close_bars()  # the error's line must not land on a bar's line
        raise SystemExit(errors.report(e, "sptlib.protocol.compare", verbose=_VERBOSE.value or None)) \
            from None
    except BaseException:
        console.close_bars()
        raise


def _main():
    if _WORKDIR.value is None:
        raise errors.ConfigError("--workdir is required; see --help")
    o = {name: flag.value for name, flag in _OVERRIDE.items()}
    seeds = parse_numbers("seeds", o["seeds"], int, low=0)
    fractions = parse_numbers("data_fractions", o["data_fractions"], low=0, high=1, low_open=True)
    factors = parse_numbers("length_factors", o["length_factors"], low=0, low_open=True)
    lrs = parse_numbers("lrs", o["lrs"], low=0, low_open=True)
    lr_seeds = parse_numbers("lr_seeds", o["lr_seeds"], int, low=0)
    shard = parse_shard(_SHARD.value)
    filename = config_flags.get_config_filename(flags.FLAGS["config"])
    overrides = config_flags.get_override_values(flags.FLAGS["config"])
    base, specs = expand(
        filename, overrides, workdir=_WORKDIR.value, models=o["models"],
        regimes=o["regimes"], seeds=seeds, data_fractions=fractions,
        rand_init=_RAND_INIT.value, lrs=lrs, lr_seeds=lr_seeds)
    if factors is None:
        factors = parse_numbers("config.compare.length_factors",
                                [str(f) for f in base.compare.length_factors] or None,
                                low=0, low_open=True) or []
    if _DRY_RUN.value:
        for s in specs:
            print(f"{s.name:40s} stages={tuple(s.config.stage_order)} -> {s.workdir}")
        return
    # The grid's own lines (each run's go to its folder); a shard has its own file, as its
    # records, so that processes sharing the workdir do not interleave in one.
    name = console.LOG_FILE if shard is None else f"log.shard{shard[0]}of{shard[1]}.txt"
    with console.log_file(_WORKDIR.value, name=name):
        _run(base, specs, filename, factors, shard)


def _run(base, specs, filename, factors, shard):
    jobs = 1 if shard is not None or _REPORT_ONLY.value else compare_jobs.resolve_jobs(
        base.compare.get("jobs", 1) if _JOBS.value is None else _JOBS.value, len(specs))
    if not _REPORT_ONLY.value:
        todo = [s for s in specs if not _finished(_resolve(s, specs))]
        console.result(display.start_line(len(specs), len(todo), jobs, _WORKDIR.value,
                                          shard=shard))
    if jobs > 1:
        # Then the table below, from the finished runs (and any run left, here).
        compare_jobs.run_rounds(sys.argv[1:], jobs, data_config=specs[0].config.data,
                                waiting=lambda: sweeps.waiting(specs, _val_accuracy, is_finished),
                                poll=display.ShardWatch(_WORKDIR.value, jobs, len(todo)))
    title = base.compare.get("title") or f"Comparison: {filename}"
    records, paths = run_comparison(specs, _WORKDIR.value, title=title, length_factors=factors,
                                    report_only=_REPORT_ONLY.value, shard=shard,
                                    deferred_only=_SHARD_DEFERRED.value)
    if shard is not None:
        if not compare_jobs.is_worker():  # --jobs's parent builds the table itself
            print(f"\nShard {shard[0]}/{shard[1]} records: {paths['json']}\nWhen every shard "
                  f"has finished, run the same command without --shard for the table and plots.")
        return
    console.result(display.summary(paths, _WORKDIR.value))
    if any(r["status"] != "finished" for r in records):
        sys.exit(1)
