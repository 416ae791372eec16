"""The exit-code contract of docs/commands.md, one test per row, in real subprocesses of the
command lines: 0 success, 2 bad input (one line, no help dump), 2 diverged (one line, the last
good checkpoint kept), 3 stopped on request (SIGTERM), 130 interrupted (SIGINT / Ctrl-C).

Rows other files already hold are not repeated: a finished run's 0 (tests/test_main.py
`test_cli_end_to_end`), SIGTERM + resume to the same fingerprint (tests/test_main.py), SIGINT +
resume (tests/test_faults.py, slow), `--help`'s 0 and a bad flag's 2 for every command
(tests/test_help.py)."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest


ROOT = pathlib.Path(__file__).resolve().parent.parent



def _env():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env.pop("XLA_FLAGS", None)
    return env


def _train(lra, wd, steps, *extra):
    """A tiny `sptlib.main` run: one scratch stage of `steps` steps on a 64-token ListOps."""
    return [sys.executable, "-m", "sptlib.main", "--config=experiments/smoke.py",
            f"--workdir={wd}", f"--config.data.lra_dir={lra}", "--config.stage_order=scratch",
            "--config.model.d_model=16", "--config.data.max_length=64",
            f"--config.stages.scratch.num_steps={steps}",
            f"--config.stages.scratch.eval_every={steps}",
            f"--config.stages.scratch.checkpoint_every={steps}",
            "--config.stages.scratch.log_every=2", "--config.stages.scratch.batch_size=8",
            "--config.stages.scratch.eval_batch_size=16", *extra]


def _lines(stderr):
    return [ln for ln in stderr.strip().splitlines() if ln.strip()]


@pytest.mark.parametrize("argv, names", [
    (["sptlib.main", "--config=experiments/smoke.py"], "--workdir is required"),
    (["sptlib.compare", "--config=experiments/quickstart.py"], "--workdir"),
    (["sptlib.main", "--config=experiments/smoke.py", "--workdir=/tmp/x", "extra"],
     "unexpected arguments ['extra']"),
    (["sptlib.main", "--config=experiments/smoke.py", "--workdir=/tmp/x",
      "--config.stages.pretrain.num_stepz=3"], "num_stepz"),
])
def test_bad_input_is_one_line_exit_2(argv, names):
    p = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, cwd=ROOT,
                       env=_env(), timeout=120)
    assert p.returncode == 2, p.stderr[-2000:]
    (line,) = _lines(p.stderr)  # one line: no usage text, no traceback
    assert line.startswith(f"{argv[0].replace('sptlib.compare', 'sptlib.protocol.compare')}: "
                           f"error: ConfigError: ") and names in line, line
    assert p.stdout == ""


def test_diverged_is_one_line_exit_2(lra, tmp_path):
    p = subprocess.run(_train(lra, tmp_path / "wd", 2, "--config.stages.scratch.optim.lr=1e9",
                              "--config.stages.scratch.optim.warmup_steps=0",
                              "--config.stages.scratch.optim.schedule=constant"),
                       capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=600)
    assert p.returncode == 2, p.stderr[-3000:]
    last = _lines(p.stderr)[-1]
    assert last.startswith("sptlib.main: stopped: NonFiniteLossError: "), last
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("sig, code, name", [(signal.SIGTERM, 3, "SIGTERM"),
                                             (signal.SIGINT, 130, "SIGINT")])
def test_stop_on_request_3_and_ctrl_c_130(lra, tmp_path, sig, code, name):
    wd = tmp_path / "wd"
    proc = subprocess.Popen(_train(lra, wd, 100_000), cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 400
        while not (wd / "scratch" / "wall_time.json").exists():  # past the first logged step
            assert proc.poll() is None and time.time() < deadline, "the run ended or stalled"
            time.sleep(0.05)
        proc.send_signal(sig)
        err = proc.communicate(timeout=300)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err[-3000:]
    last = _lines(err)[-1]
    assert last.startswith("sptlib.main: stopped: PreemptedError: [scratch] stopped"), last
    assert name in last or sig == signal.SIGTERM
    assert "Traceback" not in err
    steps = [p.name for p in (wd / "scratch" / "checkpoints").iterdir() if p.name.isdigit()]
    assert steps, "the stop saved a checkpoint of its step"
