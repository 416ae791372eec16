"""Splitting one `sptlib.protocol.compare` grid over processes: `--shard=i/n`, and `--jobs` on one machine.

On a CPU, small models do not use every core well: two 1-core processes ran ~1.4x the steps/s
of one 2-core process in our measurements (docs/reproducing.md). `--jobs=n` (or
`config.compare.jobs`) therefore starts n copies of the same command, each with `--shard=i/n`
and, where the machine has at least n cores, pinned to its own share of them; when every copy
has finished, the calling process writes the table from the finished runs as usual. A run that
an earlier, interrupted command finished is not rerun (each shard skips finished runs).

    python -m sptlib.compare --config=experiments/quickstart.py --workdir=W --jobs=2

The split (`shard_specs`) keeps the SPT cells that share a pretraining stage across the lr axis
in one shard, so that stage is trained once, and evens out the shards' training steps. With
`config.compare.lr_seeds`, a shard that reaches a later seed whose lr sweep another shard is
still training leaves it; a second round (`run_rounds`) then splits those seeds over the jobs.
Every shard chooses lrs from the sweep runs of the whole grid.

`jobs = 0` means one process per core of this machine, at most one per run, where JAX runs on
the CPU; where it has an accelerator, 0 means one process (it drives every device).

The workers die with their parent: on Linux each asks the kernel for SIGTERM when the parent
dies (`PR_SET_PDEATHSIG`; SIGTERM makes a run checkpoint and stop), and a worker whose parent is
already gone stops before it starts. A rerun never trains in a run folder that a live process
still holds: each run's workdir is locked (`sptlib.train.lock`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Sequence

from sptlib import errors


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """'1/3' -> (1, 3); None -> None. Bad values name the flag."""
    if not text:
        return None
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise errors.ConfigError(f"--shard={text!r}: expected i/n, e.g. 0/2") from None
    if n < 1 or not 0 <= i < n:
        raise errors.ConfigError(f"--shard={text!r}: need n >= 1 and 0 <= i < n")
    return i, n


def shard_specs(specs: Sequence, shard: tuple[int, int] | None, *,
                group: Callable | None = None, cost: Callable | None = None) -> list:
    """Shard i of n of `specs`, in their order.

    Units (one spec, or with `group` all the specs of one non-None `group(spec)`: the SPT cells
    of the lrs that share a pretraining stage, `sweeps.pretrain_key`, so that one shard trains it
    once and links it for the others) go round-robin, or with `cost(members) -> float` each to
    the shard with the least cost so far (ties: the lowest index), which keeps shards even when
    the units' sizes alternate.
    """
    if shard is None:
        return list(specs)
    i, n = shard
    units: dict = {}
    for k, s in enumerate(specs):
        key = group(s) if group is not None else None
        units.setdefault(("spec", k) if key is None else ("group", key), []).append(s)
    load, mine = [0.0] * n, []
    for u, members in enumerate(units.values()):
        j = u % n if cost is None else min(range(n), key=lambda j: (load[j], j))
        load[j] += cost(members) if cost is not None else 1.0
        if j == i:
            mine.extend(members)
    return mine


def usable_cores() -> list[int]:
    """This process's usable cores (all of them where the OS cannot say: macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _default_backend() -> str:
    """JAX's default backend, asked of a short-lived child process so that this one does not
    take (and keep) an accelerator the shards will need."""
    p = subprocess.run([sys.executable, "-c", "import jax; print(jax.default_backend())"],
                       capture_output=True, text=True, timeout=300)
    return p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else "cpu"


def resolve_jobs(jobs: int, num_runs: int, *, backend: Callable[[], str] = _default_backend
                 ) -> int:
    """The number of processes for `num_runs` runs: `jobs`; for `jobs` = 0 one per core on a
    CPU-only machine and 1 where JAX has an accelerator (one process drives all its devices)."""
    if jobs < 0:
        raise errors.ConfigError(f"--jobs={jobs} / config.compare.jobs: must be >= 0 "
                                 f"(0 = one process per CPU core)")
    if jobs == 0:
        jobs = len(usable_cores()) if num_runs > 1 and backend() == "cpu" else 1
    return max(1, min(jobs, num_runs))


def core_sets(jobs: int, cores: Sequence[int] | None = None) -> list[set[int] | None]:
    """Disjoint core sets, one per job (None = unpinned when there are fewer cores than jobs)."""
    cores = sorted(usable_cores() if cores is None else cores)
    if len(cores) < jobs or not hasattr(os, "sched_setaffinity"):
        return [None] * jobs
    per = len(cores) // jobs
    return [set(cores[i * per:(i + 1) * per]) for i in range(jobs)]


def shard_argv(argv: Sequence[str], i: int, n: int) -> list[str]:
    """`argv` (without the program name) with --jobs/--shard replaced by `--shard=i/n --jobs=1`."""
    keep, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--jobs", "--shard"):
            skip = True  # the value is the next word
            continue
        if a.startswith(("--jobs=", "--shard=")):
            continue
        keep.append(a)
    return keep + [f"--shard={i}/{n}", "--jobs=1"]


_PR_SET_PDEATHSIG = 1
# Set in the environment of `run_shards`' workers: their parent builds the table, so a worker
# does not tell the user to rerun without --shard (that is for a --shard the user passed).
WORKER_ENV = "SPTLIB_COMPARE_JOBS_WORKER"


def is_worker() -> bool:
    """True in a shard process started by `--jobs` (not by a user's own `--shard`)."""
    return os.environ.get(WORKER_ENV) == "1"


def _child_setup(pin, parent_pid):
    """Runs in each worker between fork and exec: die with the parent, pin to cores."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's signal forwarding remains
        pass
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(128 + signal.SIGTERM)
    if pin:
        os.sched_setaffinity(0, pin)


def run_shards(argv: Sequence[str], jobs: int, *, data_config=None,
               log: Callable[[str], None] = logging.info, cores: Sequence[int] | None = None,
               poll: Callable[[], None] | None = None) -> None:
    """Runs `python -m sptlib.compare argv --shard=i/jobs` for every i and waits for all.

    The workers show nothing but warnings and errors (stderr, shared): `poll()`, called every
    half second and once at the end, is how the parent reports their progress (one display).

    `data_config` (a run's `config.data`) is built once here first, so that generated files
    are written by one process, not raced for by every shard.

    SIGTERM/SIGINT to this process are passed on (each shard saves a checkpoint and stops);
    raises `errors.PreemptedError` if a shard was stopped that way, `errors.SptlibError` if one
    failed, so that the caller writes no table from a partial grid.
    """
    if data_config is not None:
        from sptlib.data import catalog  # deferred: imports JAX and grain, needed only here
        catalog.get_task(data_config)
    sets = core_sets(jobs, cores)
    procs = []
    for i in range(jobs):
        cmd = [sys.executable, "-m", "sptlib.compare"] + shard_argv(argv, i, jobs)
        pin = sets[i]
        log(f"[compare] job {i + 1}/{jobs}: shard {i}/{jobs}"
            + (f", cores {sorted(pin)}" if pin else ""))
        procs.append(subprocess.Popen(
            cmd, env=dict(os.environ, **{WORKER_ENV: "1"}),
            preexec_fn=lambda p=pin, me=os.getpid(): _child_setup(p, me)))

    def forward(signum, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)
    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(0.5)
            if poll is not None:
                poll()
        if poll is not None:
            poll()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    codes = [p.returncode for p in procs]
    log(f"[compare] jobs finished with exit codes {codes}")
    stopped = [c for c in codes if c in (errors.EXIT_PREEMPTED, errors.EXIT_INTERRUPTED)]
    if stopped:
        raise errors.PreemptedError(
            "a shard was stopped on request; rerun the same command to resume (finished runs "
            "are kept)", signum=signal.SIGINT if errors.EXIT_INTERRUPTED in stopped else None)
    # A shard exits 1 when one of its runs failed (the others ran): the table still shows them.
    bad = [i for i, c in enumerate(codes) if c not in (0, 1)]
    if bad:
        raise errors.SptlibError(f"shard(s) {bad} of --jobs={jobs} exited with "
                                 f"{[codes[i] for i in bad]}; their errors are above, their "
                                 f"logs in the workdir (log.shard<i>of{jobs}.txt)")


def run_rounds(argv: Sequence[str], jobs: int, *, waiting: Callable[[], Sequence],
               data_config=None, log: Callable[[str], None] = logging.info,
               poll: Callable[[], None] | None = None) -> None:
    """`run_shards`, then a second round for the runs that had to wait for another shard.

    A deferred seed (`config.compare.lr_seeds`) runs at the lr its cell's sweep chose, over the
    whole grid; a shard that reaches it while another shard still trains that sweep leaves it.
    When `waiting()` (those seeds, now runnable) lists more than one, every shard starts again
    with `--shard_deferred`, splitting the deferred seeds whose sweep has finished (a set no run
    of the round changes, so the shards agree), instead of leaving them to one process.
    """
    run_shards(argv, jobs, data_config=data_config, log=log, poll=poll)
    left = len(waiting())
    if left > 1:
        log(f"[compare] {left} runs waited for another shard's lr sweep: a second round")
        run_shards(list(argv) + ["--shard_deferred"], jobs, log=log, poll=poll)
