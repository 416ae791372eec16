"""Hostile workdirs: symlinks planted by someone else, a workdir of another user, a path too long
for the file system, a read-only checkpoints folder mid-run, the best checkpoint deleted.

Each case uses real files, real symlinks (to a decoy tree beside the workdir, which must be
byte-identical afterwards) and, where the exit matters, a real `sptlib.main` process bounded by a
timeout. The outcomes join the fault table of docs/bad_inputs.md (`test_faults.record`).
"""

import hashlib
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

from sptlib import errors
from sptlib.protocol import stages
from sptlib.train import lock as lock_lib, workdir_checks
from sptlib.train import results as results_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]
from test_bad_inputs import _config  # noqa: E402
from test_faults import _cli_env, _smoke_cmd, _wait_for, expect_error, record  # noqa: E402


OTHER_UID = 4242  # a uid that is not ours (the tests may run as root: chown works)


def tree_state(root):
    """{relative path: sha256 | 'link -> target' | 'dir'} of everything under `root`, symlinks
    not followed: what must be identical after a run next to it."""
    out = {}
    root = pathlib.Path(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = pathlib.Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = f"link -> {os.readlink(p)}"
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
                out[rel + " (mode)"] = oct(p.stat().st_mode)
    return out


@pytest.fixture
def decoy(tmp_path):
    """A tree of victim files beside the workdir; asserted unchanged (and nothing added) after
    the test."""
    d = tmp_path / "decoy"
    d.mkdir()
    for name in ("victim_lock", "victim_results", "victim_config", "victim_history",
                 "victim_summary"):
        (d / name).write_text(f"precious {name}\n")
    (d / "sub").mkdir()
    (d / "sub" / "keep.txt").write_text("keep\n")
    before = tree_state(d)
    yield d
    assert tree_state(d) == before, "a run wrote outside its workdir"


# -- planted symlinks ----------------------------------------------------------------------------

def test_planted_lock_symlink_is_refused(lra, tmp_path, decoy):
    wd = tmp_path / "wd"
    wd.mkdir()
    os.symlink(decoy / "victim_lock", wd / lock_lib.LOCK_FILE)
    expect_error("hostile", "workdir/.sptlib.lock planted as a symlink to a file outside",
                 lambda: stages.run(_config(lra), str(wd)), errors.WorkdirOwnerError,
                 "is a symbolic link")
    assert (wd / lock_lib.LOCK_FILE).is_symlink()  # left as found, never written through


def test_planted_dangling_lock_symlink_creates_nothing(lra, tmp_path, decoy):
    wd = tmp_path / "wd"
    wd.mkdir()
    os.symlink(decoy / "new_file", wd / lock_lib.LOCK_FILE)
    with pytest.raises(errors.WorkdirOwnerError):
        stages.run(_config(lra), str(wd))
    assert not (decoy / "new_file").exists()


def test_planted_temporary_symlinks_are_not_followed(lra, tmp_path, decoy):
    """`<name>.tmp` (the old fixed temporary names) and the final names themselves planted as
    symlinks into the decoy: the run finishes, writes regular files of its own, and the decoy
    is untouched (dangling links to new decoy files create nothing)."""
    wd = tmp_path / "wd"
    (wd / "scratch").mkdir(parents=True)
    plants = {
        "results.json.tmp": "victim_summary", "results.json": "victim_results",
        "scratch/results.json.tmp": "victim_results", "scratch/config.json.tmp": "victim_config",
        "scratch/history.json.tmp": "victim_history", "scratch/history.json": "new_history",
        "scratch/wall_time.json.tmp": "new_wall", "scratch/inputs.json.tmp": "new_inputs",
        "scratch/resolved.json.tmp": "new_resolved", "scratch/config.json": "new_config",
    }
    for name, target in plants.items():
        os.symlink(decoy / target, wd / name)
    res = stages.run(_config(lra), str(wd))["stages"]["scratch"]
    assert res.finished
    for name in ("results.json", "scratch/results.json", "scratch/config.json",
                 "scratch/history.json", "scratch/inputs.json", "scratch/resolved.json"):
        assert (wd / name).is_file() and not (wd / name).is_symlink(), name
    assert results_lib.read_run(wd).complete
    assert not [p for p in decoy.iterdir() if p.name.startswith("new_")]
    record("hostile", "results/config/history .json and their .tmp planted as symlinks into "
           "a decoy tree", "HELD: the run finishes, writes its own regular files (fresh "
           "temporary names, os.replace), the decoy is byte-identical")


def test_workdir_of_another_user_is_refused(lra, tmp_path, monkeypatch):
    wd = tmp_path / "wd"
    wd.mkdir()
    os.chown(wd, OTHER_UID, OTHER_UID)
    if os.stat(wd).st_uid == os.geteuid():
        pytest.skip("cannot give a folder to another uid here")
    monkeypatch.delenv(errors.FOREIGN_ENV, raising=False)
    expect_error("hostile", "a workdir owned by another user (e.g. prepared in /tmp)",
                 lambda: stages.run(_config(lra), str(wd)), errors.WorkdirOwnerError,
                 f"belongs to uid {OTHER_UID}, not to you")
    assert list(wd.iterdir()) == []
    monkeypatch.setenv(errors.FOREIGN_ENV, "1")
    workdir_checks.check_workdir(str(wd))  # asked for: accepted


def test_lock_file_of_another_user_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(errors.FOREIGN_ENV, raising=False)
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / lock_lib.LOCK_FILE).write_text("{}")
    os.chown(wd / lock_lib.LOCK_FILE, OTHER_UID, OTHER_UID)
    with pytest.raises(errors.WorkdirOwnerError, match=f"belongs to uid {OTHER_UID}"):
        lock_lib.WorkdirLock(wd).acquire()
    (wd / lock_lib.LOCK_FILE).unlink()
    (tmp_path / "elsewhere").write_text("victim")
    os.link(tmp_path / "elsewhere", wd / lock_lib.LOCK_FILE)
    with pytest.raises(errors.WorkdirOwnerError, match="2 hard links"):
        lock_lib.WorkdirLock(wd).acquire()
    assert (tmp_path / "elsewhere").read_text() == "victim"
    (wd / lock_lib.LOCK_FILE).unlink()
    with lock_lib.WorkdirLock(wd) as lk:  # a fresh lock file: private
        assert os.stat(lk.path).st_mode & 0o777 == 0o600


def test_stage_folder_symlinked_by_another_user_is_refused(lra, tmp_path, decoy, monkeypatch):
    monkeypatch.delenv(errors.FOREIGN_ENV, raising=False)
    wd = tmp_path / "wd"
    wd.mkdir()
    os.symlink(decoy / "sub", wd / "scratch")
    os.lchown(wd / "scratch", OTHER_UID, OTHER_UID)
    expect_error("hostile", "<stage> folder planted as another user's symlink into a decoy",
                 lambda: stages.run(_config(lra), str(wd)), errors.WorkdirOwnerError,
                 f"of uid {OTHER_UID}, not yours: not writing through it")


@pytest.mark.parametrize("where", ["workdir", "scratch", "scratch/checkpoints"])
def test_symlink_loop_is_one_line(lra, tmp_path, where):
    wd = tmp_path / "wd"
    target = wd if where == "workdir" else wd / where
    target.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target.name, target)  # points at itself
    expect_error("hostile", f"a symlink loop at {where}",
                 lambda: stages.run(_config(lra), str(wd)), errors.ConfigError,
                 "is a symbolic link that leads nowhere (a loop")


# -- a path too long: refused in seconds, never a hang --------------------------------------------

def _long_dir(tmp_path, total=4000):
    path = str(tmp_path / "long")
    while len(path) < total:
        path += "/" + "a" * 200
    return path


def test_workdir_path_too_long_is_one_line_and_exits(lra, tmp_path):
    """The issue's hang: a ~4,000-character workdir passed preflight, the first save raised
    ENAMETOOLONG in orbax's threads and the process never exited. Now: refused before
    training, one line, exit 2, within the timeout."""
    wd = _long_dir(tmp_path)
    t0 = time.time()
    p = subprocess.run(_smoke_cmd(lra, wd), cwd=ROOT, env=_cli_env(), capture_output=True,
                       text=True, timeout=240)
    took = time.time() - t0
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    assert lines[-1].startswith("sptlib.main: error: ConfigError: --workdir="), lines[-1]
    assert "(PATH_MAX); use a --workdir under" in lines[-1]
    record("hostile", "a workdir path of ~4,000 characters (CLI)",
           f"one line, exit 2 in {took:.0f} s: {lines[-1][:80]}...{lines[-1][-150:]}")


def test_a_name_too_long_is_one_line(tmp_path):
    with pytest.raises(errors.ConfigError, match="NAME_MAX"):
        workdir_checks.check_workdir(str(tmp_path / ("b" * 300)))


def test_write_failure_in_orbax_threads_exits(tmp_path):
    """The ENAMETOOLONG of the issue, raised where it was (an async save's background threads),
    with preflight bypassed: the CLI's one-line error, then the process exits (stuck library
    threads do not hold it up)."""
    script = f"""
import os, sys
from sptlib import errors, write_errors
from sptlib.train import checkpoint as ck
import jax.numpy as jnp
d = {str(_long_dir(tmp_path, 4090))!r}
try:
    c = ck.StageCheckpointer(d, async_saves=True)
    c.save(1, {{"w": jnp.ones(3)}}, None)
    c.close()
except Exception as e:
    found = write_errors.find_write_error(e, d)
    raise SystemExit(errors.report(found or e, "prog"))
"""
    env = dict(_cli_env(), PYTHONPATH=str(ROOT))
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=200)
    took = time.time() - t0
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert p.returncode == 2, p.stderr[-3000:]
    assert lines[-1].startswith("prog: error: WriteError: cannot write "), lines[-1]
    assert "File name too long (errno 36); use a shorter --workdir" in lines[-1]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert took < 120


@pytest.mark.slow
def test_read_only_checkpoints_mid_run_is_one_line(lra, tmp_path):
    """`checkpoints/` turned read-only (a read-only bind mount: root ignores file modes) after
    the first checkpoint: one line naming the file system error, exit 2, no orbax traceback,
    and the process exits."""
    wd = tmp_path / "wd"
    ck = wd / "scratch" / "checkpoints"
    proc = subprocess.Popen(_smoke_cmd(lra, wd, "--config.stages.scratch.num_steps=3000",
                                       "--config.stages.scratch.eval_every=3000",
                                       "--config.stages.scratch.checkpoint_every=20",
                                       "--config.stages.scratch.log_every=20"),
                            cwd=ROOT, env=_cli_env(), stderr=subprocess.PIPE, text=True)
    mounted = False
    try:
        _wait_for(ck / "20", proc)
        if subprocess.run(["mount", "--bind", str(ck), str(ck)], capture_output=True).returncode:
            pytest.skip("cannot bind-mount here (needs root)")
        mounted = True
        assert not subprocess.run(["mount", "-o", "remount,bind,ro", str(ck)],
                                  capture_output=True).returncode
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        if mounted:
            subprocess.run(["umount", "-l", str(ck)], capture_output=True)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert proc.returncode == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert lines[-1].startswith("sptlib.main: error: WriteError: cannot write "), lines[-1]
    assert "Read-only file system (errno 30)" in lines[-1], lines[-1]
    record("hostile", "checkpoints/ made read-only mid-run (read-only bind mount, CLI)",
           f"one line, exit 2, no traceback: {lines[-1][:200]}")


# -- the best checkpoint deleted ---------------------------------------------------------------

@pytest.mark.slow
def test_deleted_best_checkpoint_is_recomputed_with_a_warning(lra, tmp_path, caplog):
    """lr=0: every evaluation scores the same, so the best is the first (step 2). Its folder is
    deleted before the run finishes, and its history entry made strictly better than step 4's
    (a tie would not warn: the kept checkpoint scores as well): results.json names an existing
    best (step 4) and a warning names step 2; history.json keeps it."""
    c = _config(lra)
    c.stages.scratch.optim.update(lr=0.0, warmup_steps=0, schedule="constant")
    wd = tmp_path / "wd"
    res = stages.run(c, str(wd))["stages"]["scratch"]
    assert res.best_step == 2
    (wd / "scratch" / "results.json").unlink()  # as if killed after the last checkpoint
    shutil.rmtree(wd / "scratch" / "checkpoints" / "2")
    history_path = wd / "scratch" / "history.json"
    history = json.loads(history_path.read_text())
    history[0]["accuracy"] += 0.5  # step 2 strictly the best
    history_path.write_text(json.dumps(history))
    with caplog.at_level(logging.WARNING):
        res = stages.run(c, str(wd))["stages"]["scratch"]
    assert res.best_step == 4 and (wd / "scratch" / "checkpoints" / "4").is_dir()
    assert json.loads((wd / "scratch" / "results.json").read_text())["best_step"] == 4
    assert [h["step"] for h in res.history] == [2, 4]
    assert "the best checkpoint, step 2 (validation accuracy=" in caplog.text, caplog.text
    assert "best_step is recomputed among the checkpoints that exist (step 4)" in caplog.text
    record("hostile", "the best checkpoint's folder deleted before the run ends",
           "HELD: best_step recomputed from the checkpoints that exist (4), warning names the "
           "missing step 2; history.json keeps it")


def test_best_checkpoint_deleted_mid_run(lra, tmp_path, caplog, monkeypatch):
    """The issue's case inside one run: the best checkpoint's folder (step 2, lr=0 so every
    evaluation ties) deleted while the run goes on; the manager still lists it. The run ends
    with exit status 0 and a best that exists; as step 4 scores what step 2 scored (a tie),
    there is no warning (orbax itself keeps the later of equal checkpoints; a better step gone
    warns: test_deleted_best_checkpoint_is_recomputed_with_a_warning)."""
    from sptlib.train import checkpoint as ckpt_lib
    c = _config(lra, num_steps=6, keep=5)
    c.stages.scratch.optim.update(lr=0.0, warmup_steps=0, schedule="constant")
    wd = tmp_path / "wd"
    real = ckpt_lib.StageCheckpointer.save

    def save(self, step, *a, **k):
        out = real(self, step, *a, **k)
        if step == 4:
            self.wait_until_finished()
            shutil.rmtree(wd / "scratch" / "checkpoints" / "2")
        return out
    monkeypatch.setattr(ckpt_lib.StageCheckpointer, "save", save)
    with caplog.at_level(logging.WARNING):
        res = stages.run(c, str(wd))["stages"]["scratch"]
    assert res.finished and res.best_step == 4
    assert (wd / "scratch" / "checkpoints" / "4").is_dir()
    assert [h["step"] for h in res.history] == [2, 4, 6]
    assert "the best checkpoint, step 2" not in caplog.text, caplog.text
    record("hostile", "the best checkpoint's folder deleted mid-run (the manager still lists "
           "it)", "HELD: exit 0, best_step 4 (exists, scores as step 2 did: no warning)")
