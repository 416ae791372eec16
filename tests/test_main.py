"""The command line end to end, in real subprocesses: the smoke config, re-runs, SIGKILL + resume.

One uninterrupted smoke run (module fixture) is the reference: a second run of the same config,
SIGKILLed after its first checkpoint and started again, must end with bitwise the same
`params_fingerprint`; running a finished workdir again must not train again.
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


def _env():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # one CPU device, as a user's plain run
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _cmd(workdir, lra_dir, *overrides):
    return [sys.executable, "-m", "sptlib.main", "--config=experiments/smoke.py",
            f"--workdir={workdir}", f"--config.data.lra_dir={lra_dir}", *overrides]


def _run(cmd, timeout=300):
    t0 = time.time()
    p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=timeout)
    return p, time.time() - t0


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    base = tmp_path_factory.mktemp("smoke")
    lra = base / "lra"  # empty: the smoke config generates its small ListOps set here
    workdir = base / "wd"
    p, wall = _run(_cmd(workdir, lra))
    assert p.returncode == 0, p.stderr[-4000:]
    return {"workdir": workdir, "lra": lra, "wall": wall, "stderr": p.stderr}


def test_smoke_run_writes_the_workdir(smoke):
    wd = smoke["workdir"]
    assert smoke["wall"] < SMOKE_LIMIT_S, f"smoke run took {smoke['wall']:.1f}s"
    assert (smoke["lra"] / "listops-1000" / "basic_train.tsv").exists()
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
    # Progress lines with steps/s and ETA.
    assert re.search(r"\[pretrain\] step 10/30 \(33%\) [0-9.]+ steps/s, ETA", smoke["stderr"])


def test_rerun_resumes_instead_of_starting_over(smoke):
    wd = smoke["workdir"]
    before = {s: (wd / s / "results.json").read_text() for s in ("pretrain", "finetune")}
    p, _ = _run(_cmd(wd, smoke["lra"]))
    assert p.returncode == 0, p.stderr[-4000:]
    assert "[pretrain] already finished" in p.stderr and "[finetune] already finished" in p.stderr
    for s, text in before.items():
        assert (wd / s / "results.json").read_text() == text


def test_sigkill_after_first_checkpoint_then_resume_is_bitwise_identical(smoke, tmp_path):
    workdir = tmp_path / "wd"
    cmd = _cmd(workdir, smoke["lra"], "--config.stage_order=('pretrain',)")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    first = workdir / "pretrain" / "checkpoints" / "10"
    deadline = time.time() + 240
    try:
        while not first.exists():  # orbax renames the folder into place when it is complete
            assert proc.poll() is None, proc.stderr.read()[-4000:]
            assert time.time() < deadline, "no checkpoint appeared"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert not (workdir / "pretrain" / "results.json").exists(), "killed too late to matter"

    p, _ = _run(cmd)
    assert p.returncode == 0, p.stderr[-4000:]
    m = re.search(r"\[pretrain\] resuming from its checkpoint at step (\d+)", p.stderr)
    assert m and 10 <= int(m.group(1)) < 30, p.stderr[-3000:]
    resumed = json.loads((workdir / "pretrain" / "results.json").read_text())
    reference = json.loads((smoke["workdir"] / "pretrain" / "results.json").read_text())
    assert resumed["resumed_at_step"] == int(m.group(1))
    assert resumed["params_fingerprint"] == reference["params_fingerprint"]
    assert resumed["test"] == reference["test"]
    assert resumed["history"] == reference["history"]  # the curve survives the kill


def test_unknown_config_key_is_an_error(tmp_path):
    p, _ = _run(_cmd(tmp_path / "wd", tmp_path / "lra", "--config.stages.pretrain.num_stepz=3"))
    assert p.returncode != 0
    assert "num_stepz" in p.stderr
    assert not (tmp_path / "wd").exists()
