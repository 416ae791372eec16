"""Command line entry point: flags only, then `sptlib.protocol.stages.run(config, workdir)`.

    python -m sptlib.main --config=experiments/smoke.py --workdir=/tmp/smoke \
        [--config.stages.pretrain.num_steps=100] [--verbose]
    python -m sptlib.main --config=experiments/smoke.py --print_config   # the resolved run

Also installed as the `spt-train` console script. Re-running the same command resumes.
What it prints (`sptlib.console`): a progress bar per stage where stderr is a terminal, a line per
finished stage on stdout, warnings and errors on stderr; every detail goes to `<workdir>/log.txt`
(`--verbose`: to stderr as well).
Bad input (a config key, a data file, a checkpoint of another config, ...) is ONE line on stderr
naming what to fix, exit status 2; `--verbose` or SPTLIB_TRACEBACK=1 adds the traceback. A stop on
request (SIGTERM) exits with 3, a diverged run with 2; their checkpoints are kept.
"""

import functools
import json
import signal

from absl import app
from absl import flags

from sptlib import console
from sptlib import errors
from sptlib.configs import common
from sptlib import logs

PROG = "sptlib.main"
_CONFIG = common.define_config_flag(
    "config", "Experiment config file: experiments/X.py[:arg] (the packaged experiments, from any "
    "folder) or path/to/your_config.py[:arg]; override fields with --config.a.b=value.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output folder (local path or gs://...); each "
                               "stage writes to workdir/<stage>/.")
_VERBOSE = logs.define_verbose_flag()
_PRINT_CONFIG = flags.DEFINE_bool(
    "print_config", False, "Print the resolved run as JSON (per stage: platform, mesh on the "
    "devices present, logical rules, batch shapes, compute dtype, attention kernel) and exit; "
    "no --workdir needed.")
flags.mark_flags_as_required(["config"])


def main(argv, prepare=None):
    """Runs the parsed command; `prepare()` first, once the arguments are known to be good."""
    console.setup(PROG, verbose=_VERBOSE.value)
    try:
        _main(argv, prepare)
    except errors.SptlibError as e:
        console.close_bars()  # the error's line must not land on a bar's line
        raise SystemExit(errors.report(e, PROG, verbose=_VERBOSE.value or None)) from None
    except BaseException:
        console.close_bars()
        raise


def _main(argv, prepare):
    if len(argv) > 1:
        raise errors.ConfigError(f"unexpected arguments {argv[1:]}: every input is a --flag")
    if not _WORKDIR.value and not _PRINT_CONFIG.value:
        raise errors.ConfigError("--workdir is required (or --print_config); see --help")
    if prepare:
        prepare()
    logs.quiet_library_logs()
    if _PRINT_CONFIG.value:
        # Imported here so that `--help` and flag errors stay fast (JAX is heavy).
        from sptlib.train import resolve
        try:  # the user's files are read here: bad data is one line, as for a run
            resolved = resolve.resolve_run(_CONFIG.value)
        except errors.SptlibError as e:
            raise SystemExit(errors.report(e, PROG, verbose=_VERBOSE.value or None)) from None
        print(json.dumps([s.to_json() for s in resolved], indent=2))
        return
    # Imported here so that `--help` and flag errors stay fast (JAX, TF, orbax are heavy).
    from sptlib.protocol import stages
    from sptlib.train import results as results_lib  # with stages: heavy, after the flags
    stages.run(_CONFIG.value, _WORKDIR.value)
    where = _WORKDIR.value.rstrip("/")
    log = "" if "://" in where else f"; log: {where}/{console.LOG_FILE}"
    console.result(f"Results: {where}/{results_lib.RESULTS_FILE}{log}")


def _prepare_process():
    # After the flags parse, so `--help` and bad input import no JAX (sptlib.kernels does).
    from sptlib.kernels import platform
    platform.prepare_process()  # CPU hosts: keep XLA:CPU's buffers (re-executes this command)


def _prepared_main(argv):
    main(argv, prepare=_prepare_process)


def _stop_before_the_lock(signum, frame):  # pylint: disable=unused-argument
    raise errors.PreemptedError("stopped on request (SIGTERM) before the run took its "
                                "workdir's lock: no stage had started. Run the same command "
                                "to start it.", signum=signum)


def run():
    """Console-script entry point (`spt-train`)."""
    # A SIGTERM before the workdir's lock installs its own handler (flags, config, imports,
    # JAX start-up) is the documented stop on request, exit 3, not death by the signal.
    signal.signal(signal.SIGTERM, _stop_before_the_lock)
    try:
        app.run(_prepared_main, flags_parser=functools.partial(errors.parse_absl_flags,
                                                               prog=PROG, doc=__doc__))
    except errors.PreemptedError as e:  # raised outside main(): while the flags were parsed
        raise SystemExit(errors.report(e, PROG)) from None


if __name__ == "__main__":
    run()
