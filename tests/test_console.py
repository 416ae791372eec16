"""What a person sees (`sptlib.console`): the terminal gets warnings, errors and results, the
workdir's log.txt every detail, each line once; a real CLI run is quiet and writes nothing
outside its workdir (`sptlib.data.config.data_root`)."""

import json
import logging
import os
import pathlib
import subprocess
import sys

import pytest
from absl import logging as absl_logging

from sptlib import console
from sptlib.data import config as data_config_lib
from sptlib.protocol import compare_display

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def routed():
    """`console.setup` as a command line does it (not --verbose); undone afterwards."""
    console.setup("test", verbose=False)
    yield
    console.reset()


def _lines(text):
    return [ln for ln in text.splitlines() if ln.strip()]


def test_info_goes_to_the_file_warnings_to_both_each_once(routed, tmp_path, capsys):
    absl_logging.info("before any file")  # kept until the first log file opens
    with console.log_file(tmp_path) as path:
        absl_logging.info("an info detail")
        absl_logging.warning("a warning")
        console.result("a result")
    out, err = capsys.readouterr()
    log = pathlib.Path(path).read_text()
    assert path == str(tmp_path / "log.txt")
    assert _lines(err) == [ln for ln in _lines(err) if "a warning" in ln] and len(_lines(err)) == 1
    assert out == "a result\n"
    for needle in ("before any file", "an info detail", "a warning", "a result"):
        assert log.count(needle) == 1, (needle, log)
    assert log.startswith("==== ") and "test" in log.splitlines()[0]  # who wrote what follows


def test_verbose_brings_the_details_back_to_stderr_but_no_result_twice(tmp_path, capsys):
    console.setup("test", verbose=True)
    try:
        with console.log_file(tmp_path):
            absl_logging.info("an info detail")
            console.result("a result")
    finally:
        console.reset()
    out, err = capsys.readouterr()
    assert "an info detail" in err and "a result" not in err and out == "a result\n"


def test_nested_files_and_the_error_traceback_stay_in_the_file(routed, tmp_path, capsys):
    outer, inner = tmp_path / "grid", tmp_path / "grid" / "run"
    with console.log_file(outer):
        absl_logging.info("grid line")
        with pytest.raises(ValueError), console.log_file(inner, process_index=2):
            absl_logging.info("run line")
            raise ValueError("boom")
        absl_logging.info("grid again")
    assert capsys.readouterr().err == ""  # the traceback is the caller's to report, not ours
    grid, run = (outer / "log.txt").read_text(), (inner / "log.2.txt").read_text()
    assert "grid line" in grid and "grid again" in grid and "run line" not in grid
    assert "run line" in run and "Traceback" in run and "ValueError: boom" in run


def test_repeated_warning_once_and_orbax_slow_save_in_the_file_only(routed, tmp_path, capsys):
    orbax = logging.LogRecord("absl", logging.WARNING, "/x/orbax/checkpoint/checkpoint_manager.py",
                              1, "Waiting for previous save to complete took %f seconds.", (1.4,),
                              None)
    slow = logging.LogRecord("absl", logging.WARNING, "/x/orbax/checkpoint/checkpoint_manager.py",
                             1, "Waiting for previous save to complete took %f seconds.", (600.0,),
                             None)
    with console.log_file(tmp_path):
        for _ in range(3):
            absl_logging.warning("data truncated")
        logging.getLogger().handle(orbax)
        logging.getLogger().handle(slow)
    err = capsys.readouterr().err
    log = (tmp_path / "log.txt").read_text()
    assert err.count("data truncated") == 1 and log.count("data truncated") == 3
    assert err.count("Waiting for previous save") == 1 and "600" in err  # a slow one shows
    assert log.count("Waiting for previous save") == 2


def test_python_warnings_reach_stderr_and_the_file(routed, tmp_path, capsys):
    import warnings
    with console.log_file(tmp_path):
        warnings.warn("mind this", UserWarning)
    assert "UserWarning: mind this" in capsys.readouterr().err
    assert "UserWarning: mind this" in (tmp_path / "log.txt").read_text()


def test_a_full_disk_under_the_log_is_one_warning_not_a_traceback(routed, tmp_path, capsys,
                                                                monkeypatch):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    # The log file opened is /dev/full (a symlink to it at log.txt is replaced now: a planted
    # link is never written through, test_repro.py), so every write fails with ENOSPC.
    monkeypatch.setattr(console, "_no_follow", lambda path, flags: os.open("/dev/full", flags))
    with console.log_file(tmp_path):
        absl_logging.info("lost")
        absl_logging.info("lost too")
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Logging error" not in err
    (line,) = _lines(err)
    assert "cannot append to" in line and "log.txt" in line


def test_no_bar_frames_when_stderr_is_not_a_terminal(routed, capsys):
    bar = console.Bar("[scratch]", 0, 10)  # capsys's stderr is no terminal
    bar.update(5, loss=1.5)
    bar.close()
    assert capsys.readouterr().err == ""


def test_a_bar_on_a_terminal_shows_steps_rate_and_the_metrics(tmp_path, capsys):
    console.setup("test", bars=True)
    try:
        with console.task("(1/2) s4d/scratch/seed0"):
            bar = console.Bar("[scratch]", 0, 10)
            bar.update(4, loss=2.5)
            bar.update(6, val_accuracy=0.75)
            bar._bar.refresh()
            frame = bar._bar.__str__()
            bar.close()
    finally:
        console.reset()
    capsys.readouterr()
    assert frame.startswith("(1/2) s4d/scratch/seed0 [scratch]") and "6/10" in frame
    assert "loss=2.5" in frame and "val_accuracy=0.75" in frame and "step/s" in frame


def test_data_root_order(monkeypatch, tmp_path):
    monkeypatch.setenv("SPTLIB_DATA", str(tmp_path / "mine"))
    assert data_config_lib.data_root() == str(tmp_path / "mine")
    assert data_config_lib.data_config().lra_dir == str(tmp_path / "mine" / "lra_release")
    monkeypatch.delenv("SPTLIB_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_config_lib.data_root() == str(tmp_path / "xdg" / "sptlib" / "data")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_config_lib.data_root() == str(tmp_path / "home" / ".cache" / "sptlib" / "data")


def test_the_jobs_parent_prints_each_new_run_once(routed, tmp_path, capsys):
    wd = tmp_path / "cmp"
    old_run, new_run, failed = (str(wd / n / "seed0") for n in ("old", "new", "bad"))
    os.makedirs(old_run)
    (pathlib.Path(old_run) / "results.json").write_text("{}")
    os.utime(pathlib.Path(old_run) / "results.json", (1, 1))  # finished by an earlier command
    os.makedirs(new_run)
    (pathlib.Path(new_run) / "results.json").write_text("{}")
    watch = compare_display.ShardWatch(str(wd), 2, todo=2)
    shard0 = wd / "comparison.shard0of2.json"
    recs = [{"workdir": old_run, "status": "finished", "test_accuracy": 0.5},
            {"workdir": new_run, "status": "finished", "test_accuracy": 0.75, "wall_time_s": 65},
            {"workdir": str(wd / "wait"), "status": "missing"}]
    shard0.write_text(json.dumps(recs))
    watch()
    watch()  # nothing new: nothing printed
    recs.append({"workdir": failed, "status": "failed", "error": "ValueError: boom"})
    shard0.write_text(json.dumps(recs))
    watch()
    assert _lines(capsys.readouterr().out) == [
        "[compare] 1/2 new/seed0: test accuracy 75.00% (1m05s)",
        "[compare] 2/2 bad/seed0: FAILED: ValueError: boom (traceback in its error.txt)"]


def test_the_summary_prints_the_test_table_and_the_gains_only(tmp_path):
    md = tmp_path / "comparison.md"
    md.write_text("# T\n\nintro\n\n## Test accuracy\n\n| a |\n\n## Validation accuracy (best "
                  "checkpoint)\n\n| v |\n\n## Gain of SPT / mlpinit (points)\n\n| g |\n\n"
                  "## Compute per run (mean over seeds)\n\n| c |\n")
    text = compare_display.summary({"markdown": str(md), "json": "j", "accuracy": "a.png"},
                                   str(tmp_path))
    assert "| a |" in text and "| g |" in text and "| v |" not in text and "| c |" not in text
    assert f"Log:     {tmp_path / 'log.txt'}" in text and "Plot:    a.png" in text


def test_cli_run_is_quiet_logs_in_its_workdir_and_writes_nothing_outside(tmp_path):
    """The real command from an empty folder, the data folder and HOME elsewhere: empty stderr,
    a few result lines, the details in log.txt, the generated data in $SPTLIB_DATA, nothing in
    the current folder but the workdir; --verbose brings the details back to stderr."""
    cwd, data, home = tmp_path / "cwd", tmp_path / "data", tmp_path / "home"
    for d in (cwd, home):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "XDG_CACHE_HOME")}
    # (the native kernels stay in the cache they were built in: a new HOME would rebuild them)
    kernels = env.get("SPTLIB_KERNEL_CACHE") or os.path.expanduser("~/.cache/sptlib/kernels")
    env.update(JAX_PLATFORMS="cpu", SPTLIB_DATA=str(data), HOME=str(home),
               SPTLIB_KERNEL_CACHE=kernels,
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    s = "--config.stages.scratch."
    cmd = [sys.executable, "-m", "sptlib.main", "--config=experiments/smoke.py", "--workdir=wd",
           "--config.stage_order=scratch", "--config.model.d_model=16",
           "--config.data.max_length=64", "--config.data.generate.num_train=64",
           "--config.data.generate.num_val=16", "--config.data.generate.num_test=16",
           "--config.data.generate.max_length=64", f"{s}num_steps=4", f"{s}eval_every=2",
           f"{s}checkpoint_every=2", f"{s}log_every=2", f"{s}batch_size=8",
           f"{s}eval_batch_size=16"]
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stderr == ""
    out = _lines(p.stdout)
    assert len(out) == 2 and out[0].startswith("[scratch] finished at step 4"), out
    assert out[1] == f"Results: wd/results.json; log: wd/{console.LOG_FILE}"
    log = (cwd / "wd" / "log.txt").read_text()
    assert "ListOps: read 64 examples" in log  # (read by the preflight and by the stage)
    for needle in ("[scratch] step 2/4", "[scratch] step 2 validation",
                   "[scratch] finished at step 4", "All stages done"):
        assert log.count(needle) == 1, needle
    assert sorted(os.listdir(cwd)) == ["wd"]
    assert (data / "lra_release" / "listops-1000" / "basic_train.tsv").exists()
    assert not os.listdir(home)
    q = subprocess.run(cmd + ["--verbose"], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=600)
    assert q.returncode == 0, q.stderr[-3000:]
    assert "[scratch] already finished" in q.stderr and "ListOps: read 64 examples" in q.stderr
    log = (cwd / "wd" / "log.txt").read_text()
    assert log.count("==== ") == 2 and "[scratch] already finished" in log
    assert sorted(os.listdir(cwd)) == ["wd"]
