"""The command line end to end, in real subprocesses: the smoke config, re-runs, SIGKILL + resume.

One uninterrupted smoke run is the reference: a second run of the same config,
SIGKILLed after its first checkpoint and started again, must end with bitwise the same
`params_fingerprint`, and so must a third, stopped by SIGTERM (exit status 3) and resumed;
running a finished workdir again must not train again.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SMOKE_LIMIT_S = float(os.environ.get("SPTLIB_SMOKE_LIMIT_S", "120"))


def _env(extra=None):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # one CPU device, as a user's plain run
    env["JAX_PLATFORMS"] = "cpu"
    env.update(extra or {})
    return env


def _cmd(workdir, lra_dir, *overrides):
    return [sys.executable, "-m", "sptlib.main", "--config=experiments/smoke.py",
            f"--workdir={workdir}", f"--config.data.lra_dir={lra_dir}", *overrides]


def _run(cmd, timeout=300, env=None):
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=_env(env), capture_output=True, text=True,
                       timeout=timeout)
    return p, time.time() - t0


def _log(wd, since=0):
    """The run's log.txt (sptlib.console) from character `since` on: what an invocation added."""
    return (wd / "log.txt").read_text()[since:]


def _check_smoke_workdir(wd, lra, log):
    """The files the smoke run must leave: per stage and the summary."""
    assert (lra / "listops-1000" / "basic_train.tsv").exists()
    summary = json.loads((wd / "results.json").read_text())
    assert summary["stage_order"] == ["pretrain", "finetune"] and summary["complete"]
    for stage in ("pretrain", "finetune"):
        sd = wd / stage
        res = json.loads((sd / "results.json").read_text())
        assert res["status"] == "finished" and res["final_step"] == 30
        assert res["best_step"] in (10, 20, 30)
        for split in ("validation", "test"):
            for which in ("best", "last"):
                m = res[split][which]
                assert 0.0 <= m["accuracy"] <= 1.0 and m["loss"] > 0
        assert re.fullmatch(r"[0-9a-f]{64}", res["params_fingerprint"])
        assert res["wall_time_s"] > 0
        assert [h["step"] for h in res["history"]] == [10, 20, 30]
        assert res["history"][-1]["accuracy"] == res["validation"]["last"]["accuracy"]
        assert summary["stages"][stage]["params_fingerprint"] == res["params_fingerprint"]
        # Orbax checkpoints (latest + best), TensorBoard events, the resolved config.
        steps = sorted(int(p.name) for p in (sd / "checkpoints").iterdir() if p.name.isdigit())
        assert steps and steps[-1] == 30 and res["best_step"] in steps
        assert all((sd / "checkpoints" / str(s) / "state").is_dir() for s in steps)
        assert list(sd.glob("events.out.tfevents.*"))
        cfg = json.loads((sd / "config.json").read_text())
        assert cfg["stages"][stage]["num_steps"] == 30
    fin = json.loads((wd / "finetune" / "results.json").read_text())
    pre = json.loads((wd / "pretrain" / "results.json").read_text())
    assert fin["init"]["kind"] == "init_from"
    assert fin["init"]["checkpoint"].endswith(f"pretrain/checkpoints/{pre['best_step']}")
    # Progress lines with steps/s and ETA, in the log file.
    assert re.search(r"\[pretrain\] step 10/30 \(33%\) [0-9.]+ steps/s, ETA", log)


def _kill_after_first_checkpoint(cmd, workdir, sig=signal.SIGKILL):
    """Starts `cmd`, sends `sig` once the first pretrain checkpoint exists; returns stderr."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    first = workdir / "pretrain" / "checkpoints" / "10"
    deadline = time.time() + 240
    try:
        while not first.exists():  # orbax renames the folder into place when it is complete
            assert proc.poll() is None, proc.stderr.read()[-4000:]
            assert time.time() < deadline, "no checkpoint appeared"
            time.sleep(0.02)
        proc.send_signal(sig)
        stderr = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:  # SIGTERM: a checkpoint of the current step, one line, exit status 3
        assert proc.returncode == 3, stderr[-3000:]
        last = stderr.strip().splitlines()[-1]
        assert last.startswith("sptlib.main: stopped: PreemptedError: [pretrain] stopped at step")
        assert "Traceback" not in stderr
    assert not (workdir / "pretrain" / "results.json").exists(), "killed too late to matter"
    return stderr


@pytest.mark.slow  # 107 s idle; the default suite keeps the CLI covered by test_console (a quiet
# run), test_exit_codes (SIGTERM -> 3, Ctrl-C -> 130) and test_faults; CI's wheel test runs the CLI
def test_cli_end_to_end(tmp_path):
    """One test, so that pytest-xdist never runs the (expensive) reference smoke run twice."""
    lra = tmp_path / "lra"  # empty: the smoke config generates its small ListOps set here
    ref = tmp_path / "ref"

    # 1. The smoke run from scratch, as the docs give it.
    p, wall = _run(_cmd(ref, lra))
    assert p.returncode == 0, p.stderr[-4000:]
    assert wall < SMOKE_LIMIT_S, f"smoke run took {wall:.1f}s"
    assert p.stderr == "", p.stderr[-3000:]  # the details are in log.txt
    _check_smoke_workdir(ref, lra, _log(ref))

    # 2. The same command again resumes: nothing is trained or rewritten.
    before = {s: (ref / s / "results.json").read_text() for s in ("pretrain", "finetune")}
    seen = len(_log(ref))
    p, _ = _run(_cmd(ref, lra))
    assert p.returncode == 0, p.stderr[-4000:]
    assert "[pretrain] already finished" in _log(ref, seen)
    assert "[finetune] already finished" in _log(ref, seen)
    for s, text in before.items():
        assert (ref / s / "results.json").read_text() == text

    # 3. SIGKILL after the first checkpoint, then the same command: bitwise the same result.
    killed = tmp_path / "killed"
    cmd = _cmd(killed, lra, "--config.stage_order=('pretrain',)")
    _kill_after_first_checkpoint(cmd, killed)
    seen = len(_log(killed))
    p, _ = _run(cmd)
    assert p.returncode == 0, p.stderr[-4000:]
    m = re.search(r"\[pretrain\] resuming from its checkpoint at step (\d+)", _log(killed, seen))
    assert m and 10 <= int(m.group(1)) < 30, _log(killed, seen)[-3000:]
    resumed = json.loads((killed / "pretrain" / "results.json").read_text())
    reference = json.loads((ref / "pretrain" / "results.json").read_text())
    assert resumed["resumed_at_step"] == int(m.group(1))
    assert resumed["params_fingerprint"] == reference["params_fingerprint"]
    assert resumed["test"] == reference["test"]
    assert resumed["history"] == reference["history"]  # the curve survives the kill
    # The stage's total wall time includes the killed invocation (recorded at its last log or
    # checkpoint, step >= 10), not only the resumed one.
    assert resumed["wall_time_total_s"] > resumed["wall_time_s"] + 0.05

    # 3b. SIGTERM (preemption) after the first checkpoint: exit 3 with a checkpoint of the
    # step it stopped at; the same command resumes to bitwise the same parameters.
    termed = tmp_path / "termed"
    cmd_t = _cmd(termed, lra, "--config.stage_order=('pretrain',)")
    err = _kill_after_first_checkpoint(cmd_t, termed, signal.SIGTERM)
    stopped = int(re.search(r"stopped at step (\d+)", err).group(1))
    assert (termed / "pretrain" / "checkpoints" / str(stopped)).is_dir()
    seen = len(_log(termed))
    p, _ = _run(cmd_t)
    assert p.returncode == 0, p.stderr[-4000:]
    assert f"resuming from its checkpoint at step {stopped}" in _log(termed, seen)
    termed_res = json.loads((termed / "pretrain" / "results.json").read_text())
    assert termed_res["params_fingerprint"] == reference["params_fingerprint"]

    # 4. Resume onto another mesh: 10 more steps on 2 (fake CPU) devices, data-parallel.
    seen = len(_log(killed))
    p, _ = _run(cmd + ["--config.stages.pretrain.num_steps=40", "--config.mesh.data=2"],
                env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert p.returncode == 0, p.stderr[-4000:]
    assert "[pretrain] resuming from its checkpoint at step 30" in _log(killed, seen)
    more = json.loads((killed / "pretrain" / "results.json").read_text())
    assert more["final_step"] == 40 and more["resumed_at_step"] == 30
    assert [h["step"] for h in more["history"]] == [10, 20, 30, 40]
    assert more["history"][:3] == reference["history"]

    # (Bad input, an unknown config key included, is tests/test_bad_inputs.py's table.)
