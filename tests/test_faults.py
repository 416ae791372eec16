"""Faults around a run, table-driven: every row damages real files (or kills a real process)
and asserts the outcome, either a recovery whose `params_fingerprint` equals the uninterrupted
run's, or the exact one-line error and its exit status, with nothing lost.

Rows append `{"group", "case", "outcome"}` to the JSON-lines file named by SPTLIB_FAULTS_LOG;
`python tests/test_faults.py LOG` (from the repo root) then rewrites the faults section of
docs/bad_inputs.md from it (run the whole table, slow rows included, with `-m "slow or not slow"`;
rows a partial run did not reach keep their earlier outcome). tests/test_hostile_*.py add rows
to the same table. Every row runs beside a decoy tree that must be unchanged afterwards.
"""

import errno
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from sptlib import errors
from sptlib import write_errors

from sptlib.protocol import stages
from sptlib.data import listops
from sptlib.train import checkpoint as ckpt_lib
from sptlib.train import checkpoint_io
from sptlib.train import guards, lock as lock_lib, preflight, workdir_checks
from sptlib.train import results as results_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # also when run as a script (write_doc)
from test_bad_inputs import _config, snapshot, assert_nothing_lost  # noqa: E402


def record(group, case, outcome):
    log = os.environ.get("SPTLIB_FAULTS_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"group": group, "case": case, "outcome": outcome}) + "\n")


def expect_error(group, case, fn, kind, needle, code=2):
    """Runs `fn`; asserts it raises `kind` with `needle` in its one line and exit `code`."""
    with pytest.raises(errors.SptlibError) as e:
        fn()
    line = errors.one_line(e.value)
    assert isinstance(e.value, kind), line
    assert needle in line and "\n" not in line, line
    assert errors.exit_code(e.value) == code, line
    record(group, case, f"one line, exit {code}: {line}")
    return e.value



@pytest.fixture(scope="module")
def finished(lra, tmp_path_factory):
    """An uninterrupted tiny run (scratch, 4 steps, checkpoints at 2 and 4) and its results."""
    wd = tmp_path_factory.mktemp("ref") / "run"
    res = stages.run(_config(lra), str(wd))["stages"]["scratch"]
    return wd, res


def _copy(finished, tmp_path, unfinish=True):
    wd = tmp_path / "run"
    shutil.copytree(finished[0], wd)
    if unfinish:  # as if killed after the last checkpoint: the rerun has to restore
        (wd / "scratch" / "results.json").unlink()
    return wd


def _flip_array_bytes(step_dir, every=0):
    """Wrong bytes, same size: the largest array data file of the state (zstd-compressed
    chunks of every array), 8 bytes in its middle inverted, or one byte in each `every`."""
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    f = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(f.read_bytes())
    size = f.stat().st_size
    spots = range(64, len(data), every) if every else range(len(data) // 2, len(data) // 2 + 8)
    for i in spots:
        data[i] ^= 0xFF
    f.write_bytes(bytes(data))
    assert f.stat().st_size == size


def _recovers(group, case, lra, wd, ref, *, quarantined_type=None):
    res = stages.run(_config(lra), str(wd))["stages"]["scratch"]
    assert res.finished and res.params_fingerprint == ref.params_fingerprint
    assert [h["step"] for h in res.history] == [h["step"] for h in ref.history]
    assert res.history == ref.history
    if quarantined_type:
        q = res.init["quarantined"]
        assert q and quarantined_type in q[0]["error"], q
    record(group, case, "HELD: recovered, params_fingerprint equal to the uninterrupted run"
           + (f" ({res.init['quarantined'][0]['error'][:90]}...)" if quarantined_type else ""))
    return res


# -- checkpoint contents ---------------------------------------------------------------------

def _latest(wd):
    return wd / "scratch" / "checkpoints" / "4"


def _truncate(path, keep=25):
    path.write_text(path.read_text()[:keep])


# (group, case, damage(workdir), what init.quarantined[0].error starts with, or None when
# nothing is moved aside). Each: a copy of the finished run, damaged, results.json deleted (as if
# killed after the last checkpoint), rerun; the fingerprint and history must be the reference's.
RECOVERIES = [
    ("checkpoints", "wrong bytes (size unchanged) in an array file of the latest checkpoint",
     lambda wd: _flip_array_bytes(_latest(wd)), "CheckpointDigestError"),
    ("checkpoints", "corrupt metrics/metrics in the latest checkpoint",
     lambda wd: _truncate(_latest(wd) / "metrics" / "metrics", 11), "JSONDecodeError"),
    ("checkpoints", "digest item of the latest checkpoint deleted",
     lambda wd: shutil.rmtree(_latest(wd) / "digest"), "CheckpointDigestError"),
    ("checkpoints", "iterator state of the latest checkpoint replaced by another valid one",
     lambda wd: (_latest(wd) / "data" / "metadata").write_text(json.dumps(
         {"process_count": 1, "states": [{"format": "none"}], "digest": 1})),
     "CheckpointDigestError"),
    ("results", "truncated history.json (killed after the last checkpoint)",
     lambda wd: _truncate(wd / "scratch" / "history.json"), None),
    ("results", "truncated wall_time.json",
     lambda wd: _truncate(wd / "scratch" / "wall_time.json", 5), None),
]


@pytest.mark.slow
@pytest.mark.parametrize("group,case,damage,quarantined", RECOVERIES,
                         ids=[r[1][:40] for r in RECOVERIES])
def test_damaged_run_recovers(group, case, damage, quarantined, finished, lra, tmp_path):
    wd = _copy(finished, tmp_path)
    damage(wd)
    res = _recovers(group, case, lra, wd, finished[1], quarantined_type=quarantined)
    if quarantined:
        assert res.init["quarantined"][0]["error"].startswith(quarantined)
        moved = [p.name.split("-")[0] for p in (_latest(wd).parent / "corrupt").iterdir()]
        assert moved == ["4"]
    else:
        assert res.init == {**res.init, "kind": "resume", "step": 4, "quarantined": []}
        assert json.loads((wd / "scratch" / "history.json").read_text()) == finished[1].history
        assert list((wd / "scratch").glob("*.json.bad"))


def test_digest_catches_same_layout_other_values(tmp_path):
    """Readable files holding other values (a state folder of another step): only the digest
    can tell; the restore falls back and names the array."""
    from test_checkpoint import _toy_state, _tree_equal
    d = tmp_path / "ck"
    ck = ckpt_lib.StageCheckpointer(d, keep=3, async_saves=False)
    for s in (10, 20):
        ck.save(s, _toy_state(s), {"i": s})
    ck.close()
    shutil.rmtree(d / "20" / "state")
    shutil.copytree(d / "10" / "state", d / "20" / "state")
    ck = ckpt_lib.StageCheckpointer(d, keep=3)
    state, it, step = ck.restore_latest(checkpoint_io.abstract_like(_toy_state(0)))
    ck.close()
    assert step == 10 and it == {"i": 10} and _tree_equal(state, _toy_state(10))
    err = ck.quarantined[0]["error"]
    assert err.startswith("CheckpointDigestError") and "differs from the digest" in err
    record("checkpoints", "readable state files of another step in the latest checkpoint",
           f"HELD: moved aside, fell back to step 10 ({err[:100]}...)")


def test_corrupt_metrics_file_of_a_toy_checkpoint_falls_back(tmp_path):
    from test_checkpoint import _toy_state, _tree_equal
    d = tmp_path / "ck"
    ck = ckpt_lib.StageCheckpointer(d, keep=3, async_saves=False)
    for s in (10, 20):
        ck.save(s, _toy_state(s), {"i": s}, metrics={"loss": 1.0, "score": -1.0})
    ck.close()
    (d / "20" / "metrics" / "metrics").write_text('{"loss": 1.0, "sc')  # orbax: JSONDecodeError
    ck = ckpt_lib.StageCheckpointer(d, keep=3)
    state, it, step = ck.restore_latest(checkpoint_io.abstract_like(_toy_state(0)))
    ck.close()
    assert step == 10 and _tree_equal(state, _toy_state(10))
    assert ck.quarantined[0]["error"].startswith("JSONDecodeError")
    # Valid JSON with another value: the digest tells.
    ck = ckpt_lib.StageCheckpointer(d, keep=3, async_saves=False)
    ck.save(30, _toy_state(30), {"i": 30}, metrics={"loss": 1.0, "score": -1.0})
    ck.close()
    (d / "30" / "metrics" / "metrics").write_text('{"loss": 1.0, "score": 5.0}')
    ck = ckpt_lib.StageCheckpointer(d, keep=3)
    assert ck.all_steps() == [10] and "metrics item differs" in ck.quarantined[0]["error"]
    ck.close()


def test_init_from_refuses_a_checkpoint_whose_values_changed(tmp_path):
    """The same model saved twice; step 2's state files replaced by step 1's (readable, other
    values): `init_from` names the tensor instead of loading it."""
    from test_checkpoint import FINETUNE_HEAD, PRETRAIN_HEAD, _init, _model_cfg
    from sptlib.train import transfer
    d = tmp_path / "ck"
    ck = ckpt_lib.StageCheckpointer(d, keep=2, async_saves=False)
    for step, seed in ((1, 1), (2, 3)):
        ck.save(step, _init(_model_cfg(), PRETRAIN_HEAD, seed=seed)[0], None)
    ck.close()
    shutil.rmtree(d / "2" / "state")
    shutil.copytree(d / "1" / "state", d / "2" / "state")
    fresh, _ = _init(_model_cfg(), FINETUNE_HEAD, seed=5)
    e = expect_error("checkpoints", "init_from a checkpoint whose array values changed "
                     "(files readable)", lambda: transfer.load_pretrained(
                         d / "2", fresh.params, fresh.model_state, dont_load=("^head/",)),
                     errors.CheckpointDigestError, "differs from the digest recorded")
    assert "array '" in str(e)
    # The intact checkpoint loads, verified against its digest.
    report = transfer.load_pretrained(d / "1", fresh.params, fresh.model_state,
                                      dont_load=("^head/",))[2]
    assert report["verified"] == "verified against the save-time digest"


@pytest.mark.slow
def test_init_from_damaged_pretrain_checkpoint_is_refused(lra, tmp_path):
    c = _config(lra)
    c.stage_order = ("pretrain",)
    p = c.stages.pretrain
    p.num_steps, p.eval_every, p.checkpoint_every, p.log_every = 2, 2, 2, 2
    p.batch_size, p.eval_batch_size = 8, 16
    wd = tmp_path / "wd"
    stages.run(c, str(wd))
    _flip_array_bytes(wd / "pretrain" / "checkpoints" / "2", every=512)
    c.stage_order = ("pretrain", "finetune")
    f = c.stages.finetune
    f.num_steps, f.eval_every, f.checkpoint_every, f.log_every = 2, 2, 2, 2
    f.batch_size, f.eval_batch_size = 8, 16
    before = snapshot(wd / "pretrain")
    expect_error("checkpoints", "wrong bytes in the pretraining checkpoint, then init_from",
                 lambda: stages.run(c, str(wd)), errors.CheckpointError,
                 "the checkpoint's files are damaged")
    assert_nothing_lost(before, wd / "pretrain")
    assert not (wd / "finetune" / "checkpoints").exists() or not any(
        p.name.isdigit() for p in (wd / "finetune" / "checkpoints").iterdir())


# -- divergence ------------------------------------------------------------------------------

def test_divergence_on_the_last_step_is_not_finished(lra, tmp_path):
    c = _config(lra, num_steps=1, eval_every=1, checkpoint_every=1, log_every=1)
    c.stages.scratch.optim.update(lr=1e9, warmup_steps=0, schedule="constant")
    wd = tmp_path / "wd"
    expect_error("divergence", "optim.lr=1e9, one step (the last step diverges)",
                 lambda: stages.run(c, str(wd)), errors.NonFiniteLossError,
                 "diverged: non-finite")
    res = results_lib.read_stage(wd / "scratch")
    assert res.status == "diverged" and res.last_good_step is None
    ck = wd / "scratch" / "checkpoints"
    assert not [p for p in ck.iterdir() if p.name.isdigit()]
    assert not json.loads((wd / "results.json").read_text())["complete"]


# -- one writer per workdir ------------------------------------------------------------------

_HOLD = ("import sys, time; from sptlib.train import lock; l = lock.WorkdirLock(sys.argv[1])"
         ".acquire(); print('held', flush=True); time.sleep(120)")


def test_second_run_into_a_busy_workdir_is_refused(lra, tmp_path):
    wd = tmp_path / "wd"
    wd.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(wd)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        expect_error("workdir", "a second run into a workdir another live run holds",
                     lambda: stages.run(_config(lra), str(wd)), errors.WorkdirBusyError,
                     f"is in use by another run: pid {holder.pid} on host "
                     f"{socket.gethostname()}")
        assert sorted(p.name for p in wd.iterdir()) == [lock_lib.LOCK_FILE]
    finally:
        holder.kill()
        holder.wait()
    # The holder died (SIGKILL) without releasing: its lock is stale and is taken over.
    with lock_lib.WorkdirLock(wd) as lk:
        assert json.loads(open(lk.path).read())["pid"] == os.getpid()
    assert not (wd / lock_lib.LOCK_FILE).exists()
    record("workdir", "a lock left by a SIGKILLed run", "HELD: stale lock taken over (warning "
           "naming the dead owner)")


# -- what a stage was built from -------------------------------------------------------------

@pytest.mark.slow
def test_finished_stage_with_changed_config_warns_naming_fields(finished, lra, tmp_path,
                                                                caplog):
    wd = _copy(finished, tmp_path, unfinish=False)
    c = _config(lra)
    c.stages.scratch.optim.lr = 0.5
    before = snapshot(wd / "scratch")
    import logging
    with caplog.at_level(logging.WARNING):
        res = stages.run(c, str(wd))["stages"]["scratch"]
    assert res.params_fingerprint == finished[1].params_fingerprint
    assert "config.stages.scratch.optim.lr=" in caplog.text and "0.5 now" in caplog.text
    assert_nothing_lost(before, wd / "scratch")
    record("stages", "finished run, stages.scratch.optim.lr changed", "HELD: kept, warning "
           "names config.stages.scratch.optim.lr (old then, 0.5 now)")


@pytest.mark.slow
def test_resume_with_changed_config_keeps_the_record(finished, lra, tmp_path):
    wd = _copy(finished, tmp_path)
    before = (wd / "scratch" / "config.json").read_text()
    c = _config(lra)
    c.stages.scratch.optim.lr = 0.5  # the resume has no step left: only the record changes
    stages.run(c, str(wd))
    assert (wd / "scratch" / "config.json").read_text() == before
    later = json.loads((wd / "scratch" / "config.step4.json").read_text())
    assert later["stages"]["scratch"]["optim"]["lr"] == 0.5
    assert json.loads(before)["stages"]["scratch"]["optim"]["lr"] != 0.5
    record("stages", "resumed run with a changed stages.scratch.optim.lr", "HELD: config.json "
           "kept, config.step4.json records the new one, warning names the fields")


@pytest.mark.slow
def test_extended_upstream_reruns_the_downstream_stage(lra, tmp_path):
    def cfg(pre_steps):
        c = _config(lra)
        c.stage_order = ("pretrain", "finetune")
        for name, n in (("pretrain", pre_steps), ("finetune", 2)):
            s = c.stages[name]
            s.num_steps, s.eval_every, s.checkpoint_every, s.log_every = n, 2, 2, 2
            s.batch_size, s.eval_batch_size = 8, 16
        c.stages.finetune.init_checkpoint = "latest"
        return c
    wd = tmp_path / "wd"
    stages.run(cfg(2), str(wd))
    out = stages.run(cfg(4), str(wd))["stages"]
    fresh = stages.run(cfg(4), str(tmp_path / "fresh"))["stages"]
    assert out["finetune"].params_fingerprint == fresh["finetune"].params_fingerprint
    assert out["finetune"].init["checkpoint"].endswith("pretrain/checkpoints/4")
    assert list(tmp_path.glob("wd/finetune.stale-*"))
    record("stages", "upstream stage extended (pretrain 2 -> 4 steps) after the run finished",
           "HELD: finetune moved to finetune.stale-<time> and rerun; fingerprint equal to a "
           "fresh run")


# -- every fault is one line -------------------------------------------------------------------

def _data_error(group, case, lra, tmp_path, text, needle, kind=errors.DataError):
    data = tmp_path / "lra"
    shutil.copytree(lra, data)
    (data / listops.FOLDER / listops.SPLIT_FILES["train"]).write_bytes(text)
    return expect_error(group, case, lambda: stages.run(_config(data), str(tmp_path / "wd")),
                        kind, needle)


def test_non_utf8_byte_names_file_and_line(lra, tmp_path):
    _data_error("data", "non-UTF-8 byte in a TSV", lra, tmp_path,
                b"Source\tTarget\n( [MAX 2 3 ] )\t3\n( [MAX \xff 3 ] )\t3\n",
                "basic_train.tsv:3: not UTF-8 text: byte 0xff at column 8")


def test_bom_is_accepted(lra, tmp_path):
    path = tmp_path / "bom.tsv"
    path.write_bytes(b"\xef\xbb\xbfSource\tTarget\n( [MAX 2 3 ] )\t3\n")
    tokens, labels = listops.read_split(str(path))
    assert len(tokens) == 1 and labels.tolist() == [3]
    path.write_bytes(b"\xef\xbb\xbf( [MAX 2 3 ] )\t3\n")
    assert listops.read_split(str(path))[1].tolist() == [3]
    record("data", "UTF-8 BOM at the start of a TSV", "HELD: accepted (header or first row)")


def test_empty_lra_dir_is_an_error(lra, tmp_path):
    c = _config(lra)
    c.data.lra_dir = ""
    expect_error("data", "data.lra_dir= (empty)", lambda: stages.run(c, str(tmp_path / "wd")),
                 errors.ConfigError, "config.data.lra_dir='' is empty")
    assert not list(pathlib.Path.cwd().glob("listops-1000/.partial*"))


@pytest.mark.parametrize("sub", ["scratch", "scratch/checkpoints"])
def test_stage_path_that_is_a_file(lra, tmp_path, sub):
    wd = tmp_path / "wd"
    (wd / sub).parent.mkdir(parents=True, exist_ok=True)
    (wd / sub).write_text("x")
    expect_error("workdir", f"{sub} is a file", lambda: stages.run(_config(lra), str(wd)),
                 errors.ConfigError, f"{wd / sub}: is a file, but stage 'scratch' needs a "
                 f"folder there")


def test_unreachable_remote_workdir(monkeypatch):
    monkeypatch.setattr(workdir_checks, "REMOTE_TIMEOUT_S", 0.2)

    class Hanging:
        def __init__(self, *_):
            pass

        def exists(self):
            time.sleep(5)

    monkeypatch.setattr(workdir_checks.epath, "Path", Hanging)
    expect_error("workdir", "gs:// workdir with no network (probe never answers)",
                 lambda: workdir_checks.check_workdir("gs://nosuchbucket/x"), errors.ConfigError,
                 "--workdir=gs://nosuchbucket/x: no answer within 0 s")


def test_no_space_is_found_before_training(lra, tmp_path, monkeypatch):
    import collections
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(guards.shutil, "disk_usage", lambda p: usage(1 << 30, 1 << 30, 1 << 20))
    wd = tmp_path / "wd"
    expect_error("disk", "disk (nearly) full before training",
                 lambda: stages.run(_config(lra), str(wd)), errors.WriteError,
                 "1.0 MiB free there, a checkpoint of this stage needs about")
    assert not list(wd.rglob("checkpoints/*"))


@pytest.mark.slow
def test_disk_full_during_a_save_is_one_line(finished, lra, tmp_path, monkeypatch):
    """ENOSPC raised inside orbax's save (as tensorstore reports it): one line naming the file
    and the free space, exit 2; the earlier checkpoints are untouched."""
    wd = _copy(finished, tmp_path)
    shutil.rmtree(wd / "scratch" / "checkpoints" / "4")
    before = snapshot(wd / "scratch" / "checkpoints")
    real = ckpt_lib.StageCheckpointer.save

    def full(self, step, *a, **k):
        raise RuntimeError(f"Error writing {self.directory}/{step}/state/d/0: "
                           f"[Errno 28] No space left on device")
    monkeypatch.setattr(ckpt_lib.StageCheckpointer, "save", full)
    expect_error("disk", "disk full during a checkpoint save",
                 lambda: stages.run(_config(lra), str(wd)), errors.WriteError,
                 "No space left on device (errno 28)")
    monkeypatch.setattr(ckpt_lib.StageCheckpointer, "save", real)
    assert_nothing_lost(before, wd / "scratch" / "checkpoints")
    assert errno.ENOSPC == 28


# -- real processes ----------------------------------------------------------------------------

def _cli_env():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return env


def _smoke_cmd(lra, wd, *extra):
    return [sys.executable, "-m", "sptlib.main", "--config=experiments/smoke.py",
            f"--workdir={wd}", f"--config.data.lra_dir={lra}", "--config.stage_order=scratch",
            "--config.model.d_model=16", "--config.data.max_length=64",
            "--config.stages.scratch.num_steps=4", "--config.stages.scratch.eval_every=2",
            "--config.stages.scratch.checkpoint_every=2", "--config.stages.scratch.log_every=2",
            "--config.stages.scratch.batch_size=8", "--config.stages.scratch.eval_batch_size=16",
            *extra]


def _last_line(p):
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    return lines[-1]


@pytest.mark.slow
def test_file_size_limit_is_one_line(lra, tmp_path):
    import resource
    wd = tmp_path / "wd"

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))
    p = subprocess.run(_smoke_cmd(lra, wd), cwd=ROOT, env=_cli_env(), capture_output=True,
                       text=True, timeout=600, preexec_fn=limit)
    line = _last_line(p)
    assert p.returncode == 2 and line.startswith("sptlib.main: error: WriteError: "), line
    assert "file-size limit is 65536 bytes" in line, line
    record("disk", "ulimit -f 64 (KiB)", f"one line, exit 2: {line}")


def _fingerprint(wd):
    return results_lib.read_stage(pathlib.Path(wd) / "scratch").params_fingerprint


def _wait_for(path, proc, timeout=400):
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None and time.time() < deadline, "the run ended or stalled"
        time.sleep(0.1)


@pytest.mark.slow
def test_disk_fills_during_training_is_one_line(lra, tmp_path):
    """A real full file system: the workdir on a 20 MiB tmpfs (root only), filled up by another
    file while the run trains; the next checkpoint save fails: one line naming the file and the
    free space, exit 2, the earlier checkpoint intact."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mnt)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        wd = mnt / "wd"
        proc = subprocess.Popen(_smoke_cmd(lra, wd, "--config.stages.scratch.num_steps=3000",
                                           "--config.stages.scratch.eval_every=3000",
                                           "--config.stages.scratch.checkpoint_every=40",
                                           "--config.stages.scratch.log_every=40"),
                                cwd=ROOT, env=_cli_env(), stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(wd / "scratch" / "checkpoints" / "40", proc)
            with open(mnt / "filler", "wb") as f:  # fill the file system to the last byte
                try:
                    while True:
                        f.write(b"\0" * (1 << 16))
                except OSError as e:
                    assert e.errno == errno.ENOSPC
            _, err = proc.communicate(timeout=400)
        finally:
            if proc.poll() is None:
                proc.kill()
        line = [ln for ln in err.strip().splitlines() if ln.strip()][-1]
        assert proc.returncode == 2, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        assert line.startswith("sptlib.main: error: WriteError: cannot write "), line
        assert "No space left on device (errno 28)" in line and "MiB free there" in line, line
        import re
        assert float(re.search(r"; ([\d.]+) MiB free there", line).group(1)) < 1.0, line
        assert str(wd) in line, line
        kept = sorted(int(p.name) for p in (wd / "scratch" / "checkpoints").iterdir()
                      if p.name.isdigit())
        assert kept and kept[0] == 40
        record("disk", "the workdir's file system fills up during training (20 MiB tmpfs)",
               f"one line, exit 2: {line[:260]}")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.slow
def test_sigint_checkpoints_and_resumes(lra, tmp_path):
    """Ctrl-C mid-run: a checkpoint of the current step, one line, exit 130; the same command
    then finishes with the fingerprint of an uninterrupted run."""
    long = ("--config.stages.scratch.num_steps=200", "--config.stages.scratch.eval_every=200",
            "--config.stages.scratch.checkpoint_every=200")
    wd = tmp_path / "wd"
    proc = subprocess.Popen(_smoke_cmd(lra, wd, *long), cwd=ROOT, env=_cli_env(),
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(wd / "scratch" / "wall_time.json", proc)  # past the first logged step
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and lines[-1].startswith("sptlib.main: stopped: "
                                                           "PreemptedError: [scratch] stopped")
    assert "(SIGINT)" in lines[-1]
    steps = [int(p.name) for p in (wd / "scratch" / "checkpoints").iterdir() if p.name.isdigit()]
    assert steps and max(steps) < 200, "a checkpoint of the current step"
    for w in (wd, tmp_path / "uninterrupted"):
        p = subprocess.run(_smoke_cmd(lra, w, *long), cwd=ROOT, env=_cli_env(),
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
    assert _fingerprint(wd) == _fingerprint(tmp_path / "uninterrupted")
    record("signals", "SIGINT (Ctrl-C) during training, then the same command",
           f"HELD: checkpoint of step {max(steps)}, exit 130, one line ({lines[-1][:95]}...); "
           f"the rerun's fingerprint equals the uninterrupted run's")


@pytest.mark.slow
def test_two_cli_runs_into_one_workdir(lra, tmp_path):
    """The issue's case: a second run (another seed) into a workdir whose run is alive. It is
    refused in one line; the first finishes with its own seed's fingerprint."""
    wd = tmp_path / "wd"
    first = subprocess.Popen(_smoke_cmd(lra, wd, "--config.stages.scratch.num_steps=300"),
                             cwd=ROOT, env=_cli_env(), stderr=subprocess.DEVNULL)
    try:
        _wait_for(wd / lock_lib.LOCK_FILE, first)
        p = subprocess.run(_smoke_cmd(lra, wd, "--config.seed=7",
                                      "--config.stages.scratch.num_steps=300"),
                           cwd=ROOT, env=_cli_env(), capture_output=True, text=True, timeout=600)
        # (flock: only a live process holds it, so a refusal proves the overlap)
        assert first.wait(timeout=600) == 0
    finally:
        if first.poll() is None:
            first.kill()
    line = _last_line(p)
    assert p.returncode == 2 and line.startswith("sptlib.main: error: WorkdirBusyError: "), line
    assert f"pid {first.pid} on host {socket.gethostname()}" in line
    ref = tmp_path / "ref"
    q = subprocess.run(_smoke_cmd(lra, ref, "--config.stages.scratch.num_steps=300"), cwd=ROOT,
                       env=_cli_env(), capture_output=True, text=True, timeout=600)
    assert q.returncode == 0 and _fingerprint(wd) == _fingerprint(ref)
    record("workdir", "two CLI runs into one workdir (second with --config.seed=7)",
           f"HELD: the second stops, exit 2: {line}; the first finishes with its own "
           f"fingerprint")


@pytest.mark.slow
def test_compare_workers_die_with_their_parent(lra, tmp_path):
    """SIGKILL the `compare --jobs=2` parent: its workers get SIGTERM from the kernel and stop
    (checkpointing); none is left running."""
    wd = tmp_path / "cmp"
    cmd = [sys.executable, "-m", "sptlib.compare", "--config=experiments/quickstart.py",
           f"--workdir={wd}", "--jobs=2", f"--config.data.lra_dir={lra}",
           "--config.data.generate.enabled=True", "--seeds=0,1", "--models=transformer",
           "--regimes=scratch"]
    parent = subprocess.Popen(cmd, cwd=ROOT, env=_cli_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    kids = []
    try:
        deadline = time.time() + 300
        while len(kids) < 2 and time.time() < deadline:
            out = subprocess.run(["pgrep", "-P", str(parent.pid)], capture_output=True,
                                 text=True).stdout.split()
            kids = [int(k) for k in out]
            time.sleep(0.5)
        assert len(kids) == 2, "two workers started"
        time.sleep(3)
        parent.kill()
        parent.wait()
        deadline = time.time() + 240
        alive = kids
        while alive and time.time() < deadline:
            alive = [k for k in kids if _alive(k)]
            time.sleep(0.5)
        assert not alive, f"orphaned workers {alive}"
    finally:
        for k in kids:
            if _alive(k):
                os.kill(k, signal.SIGKILL)
    record("compare", "compare --jobs=2, its parent SIGKILLed", "HELD: both workers stopped "
           "(PR_SET_PDEATHSIG: SIGTERM), none orphaned; a rerun's run folders are locked")


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


# -- weak cases made one line (issue: hostile workdirs and shared caches) -----------------------

def _cli(args, timeout=240, **kw):
    return subprocess.run([sys.executable, "-m", "sptlib.main", *args], cwd=ROOT,
                          env=_cli_env(), capture_output=True, text=True, timeout=timeout, **kw)


def _one_line(p, code=2):
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert p.returncode == code, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    return lines[-1]


CONFIG_FILES = [
    ("fails at import", "import nosuchmodule_xyz\n\ndef get_config():\n    return None\n",
     ":1: ModuleNotFoundError: No module named 'nosuchmodule_xyz'"),
    ("raises in get_config", "def get_config():\n    x = 1\n    raise ValueError('boom')\n",
     ":3: ValueError: boom"),
    ("has a syntax error", "def get_config(:\n    pass\n", ":1: SyntaxError: "),
    ("has no get_config", "X = 1\n", ": defines no get_config() function"),
    ("returns None from get_config", "def get_config():\n    return None\n",
     ": get_config() returned None (a missing return statement?)"),
]


@pytest.mark.parametrize("case,text,needle", CONFIG_FILES, ids=[c[0] for c in CONFIG_FILES])
def test_config_file_errors_are_one_line_with_file_and_line(tmp_path, case, text, needle):
    cfg = tmp_path / "bad_config.py"
    cfg.write_text(text)
    line = _one_line(_cli([f"--config={cfg}", f"--workdir={tmp_path / 'wd'}"], timeout=120))
    assert line.startswith("sptlib.main: error: ConfigError: "), line
    assert f"{cfg}{needle}" in line, line
    assert not (tmp_path / "wd").exists()
    record("config files", f"--config file that {case} (CLI)",
           f"one line, exit 2: {line.replace(str(tmp_path), '<tmp>')}")


def test_missing_config_file_is_one_line(tmp_path):
    line = _one_line(_cli([f"--config={tmp_path / 'nosuch.py'}", f"--workdir={tmp_path / 'wd'}"],
                          timeout=120))
    assert f"--config={tmp_path / 'nosuch.py'}: cannot load the config file" in line, line
    record("config files", "--config file that does not exist (CLI)",
           f"one line, exit 2: {line.replace(str(tmp_path), '<tmp>')[:200]}")


@pytest.mark.parametrize("flags,needle", [
    (["--config.stages.scratch.optim.lr.foo=1"],
     "--config.stages.scratch.optim.lr.foo: config.stages.scratch.optim.lr is a value (float "),
    (["--config.stage_order=scratch", "--config.stage_order=pretrain"],
     "--config.stage_order is given twice ('scratch', then 'pretrain'), which would join"),
], ids=["through a value", "repeated"])
def test_config_flag_errors_name_the_flag(tmp_path, flags, needle):
    line = _one_line(_cli(["--config=experiments/smoke.py", f"--workdir={tmp_path / 'wd'}",
                           *flags], timeout=120))
    assert needle in line, line
    record("config files", f"{' '.join(flags)} (CLI)", f"one line, exit 2: {line}")


@pytest.mark.parametrize("field,value,needle", [
    ("objective.label_smoothing", 1.5, "objective.label_smoothing=1.5: must be in [0, 1)"),
    ("optim.b1", 1.5, "optim.b1=1.5: must be in [0, 1)"),
    ("optim.b2", 1.0, "optim.b2=1.0: must be in [0, 1)"),
], ids=["label_smoothing", "b1", "b2"])
def test_optimiser_values_out_of_range_are_refused(lra, tmp_path, field, value, needle):
    c = _config(lra)
    group, key = field.split(".")
    c.stages.scratch[group][key] = value
    wd = tmp_path / "wd"
    expect_error("config ranges", f"stages.scratch.{field}={value}",
                 lambda: stages.run(c, str(wd)), errors.ConfigError,
                 f"config.stages.scratch.{needle}")
    assert not (wd / "scratch").exists()


def test_batch_larger_than_the_training_split_is_warned(lra, tmp_path, caplog):
    c = _config(lra, batch_size=128)
    import logging
    with caplog.at_level(logging.WARNING):
        preflight.check(c, str(tmp_path / "wd"))
    line = next(r.getMessage() for r in caplog.records if "batch_size=128" in r.getMessage())
    assert "is larger than the training split (64 examples)" in line
    record("config ranges", "stages.scratch.batch_size=128 on a 64-example training split",
           f"warning (one line), the run goes on: {line}")


@pytest.mark.slow
def test_diverged_stage_rerun_with_a_sane_lr_records_its_config(lra, tmp_path, caplog):
    """lr=1e10 diverges on its first step (no checkpoint kept); the rerun with lr=3e-3 starts
    from step 0: its config.json is the new one, the diverged attempt's is kept beside it."""
    c = _config(lra, num_steps=1, eval_every=1, checkpoint_every=1, log_every=1)
    c.stages.scratch.optim.update(lr=1e10, warmup_steps=0, schedule="constant")
    wd = tmp_path / "wd"
    with pytest.raises(errors.NonFiniteLossError):
        stages.run(c, str(wd))
    c.stages.scratch.optim.lr = 3e-3
    import logging
    with caplog.at_level(logging.WARNING):
        res = stages.run(c, str(wd))["stages"]["scratch"]
    assert res.finished and res.init["kind"] == "random"
    saved = json.loads((wd / "scratch" / "config.json").read_text())
    assert saved["stages"]["scratch"]["optim"]["lr"] == 3e-3
    (before,) = (wd / "scratch").glob("config.before-*.json")
    assert json.loads(before.read_text())["stages"]["scratch"]["optim"]["lr"] == 1e10
    assert "resuming at step None" not in caplog.text
    line = next(r.getMessage() for r in caplog.records if "starting from step 0" in r.getMessage())
    record("divergence", "a diverged stage (no good checkpoint) rerun with a sane lr",
           f"HELD: trains from step 0; config.json records lr=0.003, the diverged attempt's "
           f"kept as {before.name.split('-')[0]}-<time>.json; warning: {line[:160]}...")


def test_divergence_with_lr_1e9_is_one_line(lra, tmp_path):
    """The `lr=1e9` row of docs/bad_inputs.md, as it happens now."""
    c = _config(lra)
    c.stages.scratch.optim.update(lr=1e9, warmup_steps=0, schedule="constant")
    wd = tmp_path / "wd"
    e = expect_error("divergence", "optim.lr=1e9 (4 steps, checkpoints every 2)",
                     lambda: stages.run(c, str(wd)), errors.NonFiniteLossError,
                     "[scratch] diverged: non-finite")
    res = results_lib.read_stage(wd / "scratch")
    assert res.status == "diverged" and res.message == str(e)
    aside = wd / "scratch" / "checkpoints" / ckpt_lib.DIVERGED_DIR
    moved = sorted(p.name.split("-")[0] for p in aside.iterdir()) if aside.exists() else []
    kept = sorted(p.name for p in (wd / "scratch" / "checkpoints").iterdir() if p.name.isdigit())
    assert (f"moved to {ckpt_lib.DIVERGED_DIR}/" in str(e)) == bool(moved)
    record("divergence", "optim.lr=1e9 (4 steps, checkpoints every 2): what is kept",
           f"HELD: status diverged, last_good_step {res.last_good_step}; checkpoints kept "
           f"{kept}, moved to diverged/ {moved}")


def test_data_folder_symlink_loop_is_one_line(lra, tmp_path):
    data = tmp_path / "lra"
    shutil.copytree(lra, data)
    shutil.rmtree(data / listops.FOLDER)
    os.symlink(listops.FOLDER, data / listops.FOLDER)
    expect_error("hostile", "the data folder (lra_dir/listops-1000) a symlink to itself",
                 lambda: stages.run(_config(data), str(tmp_path / "wd")), errors.ConfigError,
                 "is a symbolic link that leads nowhere (a loop")


def _tmpfs(path, size):
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")


def test_disk_full_while_data_is_generated_names_the_folder(tmp_path):
    """A real full file system (a 64 KiB tmpfs) while ListOps is generated in preflight."""
    mnt = tmp_path / "small"
    _tmpfs(mnt, "64k")
    try:
        c = _config(mnt / "lra")
        c.data.generate.update(enabled=True, num_train=3000, num_val=20, num_test=20)
        e = expect_error("disk", "disk full while ListOps data is generated (64 KiB tmpfs)",
                         lambda: stages.run(c, str(tmp_path / "wd")), errors.WriteError,
                         "No space left on device (errno 28)")
        assert str(mnt / "lra") in str(e) and "MiB free there" in str(e)
        # ... and results written by write_json name their own file.
        with pytest.raises(OSError) as full:
            results_lib.write_json(mnt / "big.json", {"x": "y" * (1 << 20)})
        found = write_errors.find_write_error(full.value)
        assert f"cannot write {mnt / 'big.json'}: No space left on device" in str(found)
        assert not [p for p in mnt.iterdir() if p.name.endswith(".tmp")]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


_GENERATE = ("import logging, sys; logging.basicConfig(level=logging.INFO); "
             "from sptlib.data import get_task, data_config; c = data_config(); "
             "c.update(task='listops', lra_dir=sys.argv[1], max_length=64); "
             "c.generate.update(enabled=True, num_train=1500, num_val=20, num_test=20, "
             "min_length=10, max_length=64); get_task(c); print('ok')")


def test_two_runs_sharing_a_missing_data_folder_take_turns(tmp_path):
    """Two processes start at once on one missing lra_dir: one generates, the other waits on
    the data-folder lock and uses it; no complete folder is moved aside as incomplete."""
    lra_dir = tmp_path / "shared_lra"
    env = dict(_cli_env(), PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", _GENERATE, str(lra_dir)], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    names = sorted(p.name for p in lra_dir.iterdir())
    assert names == [".listops-1000.lock", "listops-1000"], names
    assert sum("ListOps: generating" in err for _, err in outs) == 1, [o[1][-800:] for o in outs]
    record("data", "two runs sharing one missing lra_dir, started at once (2 processes)",
           "HELD: one generates, the other waits on the data-folder lock and reads it; nothing "
           "moved aside")


def test_sigterm_during_preflight_exits_3_and_releases_the_lock(lra, tmp_path):
    """SIGTERM as soon as the run holds the lock (preflight, data loading, first compile):
    exit 3, one line, the lock released."""
    wd = tmp_path / "wd"
    proc = subprocess.Popen(_smoke_cmd(lra, wd), cwd=ROOT, env=_cli_env(),
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(wd / lock_lib.LOCK_FILE, proc, timeout=200)
        while '"pid"' not in (wd / lock_lib.LOCK_FILE).read_text():  # the owner is recorded
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert proc.returncode == 3, err[-3000:]
    assert "Traceback" not in err and lines[-1].startswith(
        "sptlib.main: stopped: PreemptedError: "), lines[-1]
    assert "(SIGTERM)" in lines[-1]
    assert not (wd / lock_lib.LOCK_FILE).exists()
    record("signals", "SIGTERM as soon as the lock is taken (preflight / data loading)",
           f"one line, exit 3, lock released: {lines[-1][:150]}")


@pytest.mark.slow
def test_resume_on_another_device_count_is_recorded(lra, tmp_path):
    wd = tmp_path / "wd"
    two = dict(_cli_env(), XLA_FLAGS="--xla_force_host_platform_device_count=2")
    p = subprocess.run(_smoke_cmd(lra, wd, "--config.stages.scratch.num_steps=2"), cwd=ROOT,
                       env=two, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    (wd / "scratch" / "results.json").unlink()  # unfinished: 4 steps asked now
    p = subprocess.run(_smoke_cmd(lra, wd), cwd=ROOT, env=_cli_env(), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    init = results_lib.read_stage(wd / "scratch").init
    assert init["kind"] == "resume"
    assert init["layout_changed"]["before"]["devices"] == 2
    assert init["layout_changed"]["now"]["devices"] == 1
    assert "resuming on 1 devices" in p.stderr
    record("workdir", "a resume on 1 device of a run started on 2 (CLI)",
           "HELD: results.json init.layout_changed records both; one warning")


# -- nothing outside the workdir changes ---------------------------------------------------------

@pytest.fixture(autouse=True)
def _decoy_beside_the_workdir(tmp_path):
    """Every row runs with a decoy tree beside its workdir(s) in `tmp_path`: it must be
    byte-identical afterwards (no run writes outside its workdir)."""
    from test_hostile_workdirs import tree_state
    decoy = tmp_path / "decoy"
    decoy.mkdir(exist_ok=True)
    (decoy / "precious.txt").write_text("precious\n")
    (decoy / "sub").mkdir(exist_ok=True)
    (decoy / "sub" / "results.json").write_text('{"mine": true}\n')
    before = tree_state(decoy)
    yield
    assert tree_state(decoy) == before, "a run modified files outside its workdir"


# -- docs ----------------------------------------------------------------------------------------

BEGIN, END = "<!-- faults:begin -->", "<!-- faults:end -->"


def _section_rows(text):
    """[(group, case, outcome)] of the faults section already in the doc."""
    if BEGIN not in text:
        return []
    rows, group = [], None
    for ln in text[text.index(BEGIN) + len(BEGIN):text.index(END)].splitlines():
        if ln.startswith("### "):
            group = ln[4:].strip()
        elif ln.startswith("- ") and " — " in ln and group:
            case, outcome = ln[2:].split(" — ", 1)
            rows.append((group, case, outcome))
    return rows


def write_doc(log, doc=ROOT / "docs" / "bad_inputs.md"):
    """Rewrites the faults section from `log`; rows the log does not have (a partial run, e.g.
    without the slow ones) keep their earlier outcome."""
    import re
    latest = {(g, c): o for g, c, o in _section_rows(doc.read_text())}
    for ln in open(log):
        if ln.strip():
            r = json.loads(ln)
            # The last run of a case is kept, in the place the case had.
            latest[(r["group"], r["case"])] = re.sub(r"/tmp/pytest-of-[^/]+/pytest-\d+/"
                                                     r"(popen-gw\d+/)?", "<tmp>/", r["outcome"])
    lines = []
    for group in dict.fromkeys(g for g, _ in latest):
        lines.append(f"\n### {group}")
        lines += [f"- {case} — {out}" for (g, case), out in latest.items() if g == group]
    text = doc.read_text()
    section = BEGIN + "\n" + "\n".join(lines).strip() + "\n" + END
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    doc.write_text(text)


if __name__ == "__main__":
    write_doc(sys.argv[1])


def test_sigterm_swallowed_where_python_ran_the_handler_still_stops(tmp_path):
    """Python may run the lock's SIGTERM handler inside a garbage-collection callback, which
    prints and drops its exception (seen in CI: the run then finished with exit 0). The request
    is recorded: the stage runner raises it before the next stage, and the training loop's own
    handler adopts it; releasing the lock forgets it."""
    from sptlib.errors import PreemptedError
    from sptlib.protocol import stages
    from sptlib.train import signals

    lock = lock_lib.WorkdirLock(tmp_path / "wd").acquire()
    try:
        handler = signal.getsignal(signal.SIGTERM)
        with pytest.raises(PreemptedError):
            handler(signal.SIGTERM, None)  # raised, then dropped by the (simulated) callback
        assert lock_lib.pending_stop() == signal.SIGTERM
        with pytest.raises(PreemptedError, match=r"\(SIGTERM\)"):
            stages._honour_pending_stop()
        flag = signals.StopFlag().install()
        try:
            assert flag.requested and flag.signum == signal.SIGTERM
        finally:
            flag.uninstall()
    finally:
        lock.release()
    assert lock_lib.pending_stop() is None
    stages._honour_pending_stop()  # nothing pending: no error
