"""`sptlib.protocol.compare --jobs`: the grid split over processes, each pinned to its own cores, then
one table — checked against the argument rules by hand and with a real 2-process CLI run."""

import json
import os
import subprocess
import sys

import pytest

from sptlib.protocol import compare_jobs
from sptlib import errors

import test_compare  # noqa: E402 (tests/ is on sys.path under pytest)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_shard_argv_replaces_jobs_and_shard_in_both_spellings():
    argv = ["--config=x.py", "--jobs=3", "--workdir", "W", "--shard", "1/4", "--jobs", "2"]
    assert compare_jobs.shard_argv(argv, 1, 2) == ["--config=x.py", "--workdir", "W",
                                                    "--shard=1/2", "--jobs=1"]


def test_core_sets_are_disjoint_shares_or_unpinned():
    assert compare_jobs.core_sets(2, cores=[0, 1, 2, 3]) == [{0, 1}, {2, 3}]
    assert compare_jobs.core_sets(2, cores=[0, 1, 2]) == [{0}, {1}]
    assert compare_jobs.core_sets(3, cores=[0, 1]) == [None, None, None]


def test_resolve_jobs():
    cores = len(os.sched_getaffinity(0))
    cpu, gpu = (lambda: "cpu"), (lambda: "gpu")
    assert compare_jobs.resolve_jobs(0, 100, backend=cpu) == cores
    assert compare_jobs.resolve_jobs(0, 100, backend=gpu) == 1  # one process per accelerator
    assert compare_jobs.resolve_jobs(0, 1, backend=pytest.fail) == 1  # one run: nothing to ask
    assert compare_jobs.resolve_jobs(5, 2) == 2  # never more processes than runs
    assert compare_jobs.resolve_jobs(1, 8) == 1
    assert compare_jobs.resolve_jobs(2, 8, backend=gpu) == 2  # asked for explicitly
    with pytest.raises(errors.ConfigError, match="--jobs=-1"):
        compare_jobs.resolve_jobs(-1, 4)


def test_default_backend_is_asked_of_a_child_process():
    import jax
    assert compare_jobs._default_backend() == jax.default_backend()


# The real tiny comparison of test_compare (2 seeds, length evaluation at 2x).
_TINY = test_compare._REAL


def test_two_jobs_run_disjoint_halves_then_one_table(tmp_path):
    """Real CLI: 2 runs, --jobs=2 → two shard processes with one run each, data generated once
    (by the parent, before the shards start), and the full table from the parent."""
    path = tmp_path / "tiny.py"
    path.write_text(_TINY.format(lra=str(tmp_path / "lra")))
    wd = tmp_path / "cmp"
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "sptlib.compare", f"--config={path}",
                        f"--workdir={wd}", "--jobs=2"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    log = (wd / "log.txt").read_text()
    assert "job 2/2: shard 1/2" in log
    # One display: the parent prints a line per run its workers finished, each once; the
    # workers' details are in their own files, nothing on stderr.
    runs = [ln for ln in p.stdout.splitlines() if ln.startswith("[compare] ") and "seed" in ln]
    assert sorted(ln.split(" ")[1] for ln in runs) == ["1/2", "2/2"], p.stdout
    assert sorted(ln.split(" ")[2] for ln in runs) == ["attention/scratch/seed0:",
                                                       "attention/scratch/seed1:"], p.stdout
    # (this config truncates examples on purpose: those warnings, once per process, are all)
    assert all(ln.startswith("W") and "truncated at max_length" in ln
               for ln in p.stderr.splitlines()), p.stderr[-3000:]
    assert "[scratch] step 4/4" in (wd / "attention/scratch/seed1/log.txt").read_text()
    assert "1 runs, 0 already finished, 1 to run" in (wd / "log.shard1of2.txt").read_text()
    # The rerun-without---shard advice is for a --shard the user passed, not for --jobs's shards.
    assert "without --shard" not in p.stdout + p.stderr
    shards = [json.loads((wd / f"comparison.shard{i}of2.json").read_text()) for i in range(2)]
    seeds = [[r["seed"] for r in records] for records in shards]
    assert sorted(seeds) == [[0], [1]]
    # The parent found both runs finished and wrote the table of both.
    assert "2 runs, 2 already finished, 0 to run" in log
    table = (wd / "comparison.md").read_text()
    assert "(2)" in table
    # One generation only: no folder moved aside by a second generator.
    assert not [n for n in os.listdir(tmp_path / "lra") if ".replaced-" in n]
    # A --shard of the user's own: the advice is printed (its run is finished: nothing trains).
    p = subprocess.run([sys.executable, "-m", "sptlib.compare", f"--config={path}",
                        f"--workdir={wd}", "--shard=0/2"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "run the same command without --shard" in p.stdout, p.stderr


def test_shard_specs_keep_a_group_in_one_shard():
    specs = ["a1", "b1", "a2", "c", "b2", "d"]
    group = {"a1": "a", "a2": "a", "b1": "b", "b2": "b"}.get  # c, d: one spec each
    shards = [compare_jobs.shard_specs(specs, (i, 2), group=group) for i in range(2)]
    assert shards == [["a1", "a2", "c"], ["b1", "b2", "d"]]
    assert [compare_jobs.shard_specs(specs, (i, 3)) for i in range(3)] == [
        ["a1", "c"], ["b1", "b2"], ["a2", "d"]]
    assert compare_jobs.shard_specs(specs, None, group=group) == specs


def test_run_rounds_starts_a_second_round_only_for_runs_that_waited(monkeypatch):
    rounds = []
    monkeypatch.setattr(compare_jobs, "run_shards",
                        lambda argv, jobs, **kw: rounds.append((list(argv), jobs)))
    compare_jobs.run_rounds(["--config=x.py"], 2, waiting=lambda: ["a"], log=lambda s: None)
    assert rounds == [(["--config=x.py"], 2)]  # one run left: the parent runs it
    rounds.clear()
    compare_jobs.run_rounds(["--config=x.py"], 2, waiting=lambda: ["a", "b"], log=lambda s: None)
    assert rounds == [(["--config=x.py"], 2), (["--config=x.py", "--shard_deferred"], 2)]
