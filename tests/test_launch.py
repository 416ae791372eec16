"""Launch scripts: `--dry-run` output (exact gcloud / sbatch commands), and the worker scripts run
for real in a sandbox HOME with a stub Python, so that three levels of shell quoting are checked.
Nothing reaches a network: subprocess runs get a PATH whose `gcloud` / `sbatch` only record."""

import os
import re
import shlex
import subprocess
import sys
import time

import pytest

from sptlib.launch import common, slurm, tpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = ["--name=spt", "--zone=us-central2-b", "--accelerator-type=v4-32",
       "--config=experiments/pathx.py", "--workdir=gs://my-bucket/spt/pathx"]


def _commands(plan):
    return [s.argv for s in plan.steps if s.argv is not None]


def _flag(argv, name):
    return [a.split("=", 1)[1] for a in argv if a.startswith(name + "=")]


def test_jax_pin_matches_the_tested_constraints():
    """The pod installs the jax the constraints file pins (what CI tests), inside pyproject.toml's
    declared range."""
    pins = open(os.path.join(REPO, "constraints.txt")).read()
    assert re.search(r"^jax==([\d.]+)$", pins, re.M).group(1) == common.JAX_VERSION
    project = open(os.path.join(REPO, "pyproject.toml")).read()
    low = re.search(r'"jax>=([\d.]+),', project).group(1)
    assert tuple(map(int, low.split("."))) <= tuple(map(int, common.JAX_VERSION.split(".")))


@pytest.mark.parametrize("mode, flag, alpha", [
    ("spot", "--spot", False), ("reserved", "--reserved", False),
    ("best-effort", "--best-effort", True), ("on-demand", None, False)])
def test_create_single_slice(mode, flag, alpha):
    args = tpu.parse_args(["create", "--name=spt", "--zone=us-central2-b",
                           "--accelerator-type=v4-32", f"--mode={mode}", "--project=proj"])
    argv = _commands(tpu.make_plan(args))[0]
    head = ["gcloud"] + (["alpha"] if alpha else []) + [
        "compute", "tpus", "queued-resources", "create", "spt"]
    assert argv[:len(head)] == head
    assert _flag(argv, "--zone") == ["us-central2-b"] and _flag(argv, "--project") == ["proj"]
    assert _flag(argv, "--accelerator-type") == ["v4-32"]
    assert _flag(argv, "--runtime-version") == ["tpu-ubuntu2204-base"]
    assert _flag(argv, "--node-id") == ["spt"] and not _flag(argv, "--node-count")
    modes = {"--spot", "--reserved", "--best-effort"}
    assert [a for a in argv if a in modes] == ([flag] if flag else [])
    # Then it waits for the slice: the describe poll.
    assert "queued-resources describe spt" in tpu.make_plan(args).render()


def test_create_multislice_v5e():
    args = tpu.parse_args(["create", "--name=ms", "--zone=us-west4-a",
                           "--accelerator-type=v5e-16", "--num-slices=2", "--no-wait"])
    plan = tpu.make_plan(args)
    assert len(plan.steps) == 1
    argv = plan.steps[0].argv
    assert _flag(argv, "--accelerator-type") == ["v5litepod-16"]
    assert _flag(argv, "--runtime-version") == ["v2-alpha-tpuv5-lite"]
    assert _flag(argv, "--node-count") == ["2"] and _flag(argv, "--node-prefix") == ["ms"]
    assert not _flag(argv, "--node-id")


def test_delete_and_setup_commands():
    args = tpu.parse_args(["delete", "--name=spt", "--zone=z"])
    assert _commands(tpu.make_plan(args)) == [[
        "gcloud", "compute", "tpus", "queued-resources", "delete", "spt", "--zone=z", "--force",
        "--quiet"]]
    args = tpu.parse_args(["setup", "--name=spt", "--zone=z", "--gcsfuse-bucket=my-bucket"])
    plan = tpu.make_plan(args)
    assert "git -C" in plan.steps[0].script and "--exclude-standard" in plan.steps[0].script
    scp, ssh = _commands(plan)
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
    assert scp[5] == "/tmp/sptlib-spt.tar.gz" and scp[6] == "spt:sptlib.tar.gz"
    assert "--worker=all" in scp and "--worker=all" in ssh
    script = _flag(ssh, "--command")[0]
    assert "'jax[tpu]==0.10.2'" in script and "-e ~/sptlib" in script
    assert "--python=3.11" in script and "gcsfuse --implicit-dirs my-bucket /mnt/gcs" in script
    bash_n = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
    assert bash_n.returncode == 0, bash_n.stderr
    args = tpu.parse_args(["setup", "--name=spt", "--zone=z", "--source=git",
                           "--git-url=https://example.com/sptlib.git", "--git-ref=v0.1"])
    (ssh,) = _commands(tpu.make_plan(args))
    assert "fetch -q --depth=1 https://example.com/sptlib.git v0.1" in _flag(ssh, "--command")[0]


def test_setup_from_a_wheel_needs_no_checkout(tmp_path):
    """`--source=wheel`: the wheel is copied to every worker and installed (not editable) with
    the `gcs` extra; no checkout is packed or unpacked. Without TensorFlow in the core install,
    gcsfs is what lets etils.epath write the gs:// workdir."""
    args = tpu.parse_args(["setup", "--name=spt", "--zone=z", "--source=wheel",
                           "--wheel=dist/sptlib-0.1.0-py3-none-any.whl"])
    scp, ssh = _commands(tpu.make_plan(args))
    assert scp[5:7] == ["dist/sptlib-0.1.0-py3-none-any.whl", "spt:sptlib-0.1.0-py3-none-any.whl"]
    script = _flag(ssh, "--command")[0]
    assert "sptlib.tar.gz" not in script and "git " not in script and " -e " not in script
    assert subprocess.run(["bash", "-n", "-c", script]).returncode == 0
    # The install word as the worker's bash expands it: ~ to $HOME, the extra kept literally.
    word = script.split("'jax[tpu]==0.10.2' ")[1].split(";")[0]
    echo = subprocess.run(["bash", "-c", f"printf '%s\\n' {word}"], capture_output=True,
                          text=True, env=dict(os.environ, HOME=str(tmp_path)))
    assert echo.stdout == f"{tmp_path}/sptlib-0.1.0-py3-none-any.whl[gcs]\n"
    args = tpu.parse_args(["setup", "--name=spt", "--zone=z", "--source=wheel"])
    with pytest.raises(SystemExit, match="--wheel=PATH.whl"):
        tpu.make_plan(args)


def test_slurm_job_starts_in_the_given_folder_not_a_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = ["--config=experiments/lra.py:listops,s4,spt-masked", "--workdir=/shared/x"]
    args = slurm.parse_args(base)
    assert args.chdir == str(tmp_path) and args.log_dir == str(tmp_path / "slurm-logs")
    assert f"\ncd {tmp_path}\n" in slurm.render(args)
    args = slurm.parse_args([*base, "--checkout=/shared/sptlib"])  # the old name still works
    assert "\ncd /shared/sptlib\n" in slurm.render(args)


def test_run_multislice_runs_every_node_at_once():
    args = tpu.parse_args(["run", *RUN, "--num-slices=2", "--", "--config.seed=3"])
    plan = tpu.make_plan(args)
    cmds = _commands(plan)
    assert [c[5] for c in cmds] == ["spt-0", "spt-1"]
    assert all("--worker=all" in c for c in cmds)
    rendered = plan.render()
    assert rendered.count(" &\n") == 2 and rendered.rstrip().endswith("wait")
    script = _flag(cmds[0], "--command")[0]
    assert "--config.mesh.data=16" in script and "--config.mesh.dcn_data=2" in script
    assert script.index("--config.mesh.dcn_fsdp=1") < script.index("--config.seed=3")


def test_run_refuses_local_workdir():
    args = tpu.parse_args(["run", *RUN[:4], "--workdir=/home/me/run"])
    with pytest.raises(ValueError, match="not on gs://"):
        tpu.make_plan(args)


def _fake_bin(tmp_path):
    """A PATH dir whose gcloud/sbatch/scontrol record their argv and exit 0."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls.txt"
    for tool in ("gcloud", "sbatch", "scontrol"):
        p = bindir / tool
        p.write_text(f'#!/bin/bash\necho "{tool} $*" >> {calls}\n')
        p.chmod(0o755)
    return bindir, calls


def test_run_worker_script_executes_in_sandbox(tmp_path):
    """The exact --command `run` sends, run by bash on a fake worker: stub python gets the
    experiment argv and env, the log lands in ~/spt-logs, the pid file names the job, and the
    log is copied to the gs:// workdir at the end."""
    home = tmp_path / "home"
    (home / "sptlib").mkdir(parents=True)
    (home / "spt-venv/bin").mkdir(parents=True)
    stub = home / "spt-venv/bin/python"
    stub.write_text('#!/bin/bash\necho "PWD=$PWD"\necho "JAX_PLATFORMS=$JAX_PLATFORMS"\n'
                    'echo "SPTLIB_DISTRIBUTED=$SPTLIB_DISTRIBUTED"\n'
                    'echo "FOO=$FOO"\nfor a in "$@"; do echo "ARG=$a"; done\n')
    stub.chmod(0o755)
    bindir, calls = _fake_bin(tmp_path)
    args = tpu.parse_args(["run", *RUN, "--env=FOO=a b'c", "--", "--config.model.name=x y"])
    (ssh,) = _commands(tpu.make_plan(args))
    script = _flag(ssh, "--command")[0]
    env = dict(os.environ, HOME=str(home), PATH=f"{bindir}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    host = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    log = home / "spt-logs" / f"pathx.{host}.log"
    deadline = time.time() + 10
    while time.time() < deadline and not (calls.exists() and "storage cp" in calls.read_text()):
        time.sleep(0.05)
    lines = log.read_text().splitlines()
    assert lines[0] == f"PWD={home}/sptlib"
    assert "SPTLIB_DISTRIBUTED=1" in lines
    assert "JAX_PLATFORMS=tpu,cpu" in lines and "FOO=a b'c" in lines
    argv = [line[4:] for line in lines if line.startswith("ARG=")]
    assert argv == ["-m", "sptlib.main", "--config=experiments/pathx.py",
                    "--workdir=gs://my-bucket/spt/pathx", "--config.mesh.data=16",
                    "--config.mesh.fsdp=1", "--config.mesh.tensor=1", "--config.mesh.dcn_data=1",
                    "--config.mesh.dcn_fsdp=1", "--config.model.name=x y"]
    assert (home / "spt-logs/pathx.pid").read_text().strip().isdigit()
    assert f"gcloud storage cp {log} gs://my-bucket/spt/pathx/logs/" in calls.read_text()


def test_cli_dry_run_runs_nothing(tmp_path):
    bindir, calls = _fake_bin(tmp_path)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    up = [sys.executable, "-m", "sptlib.launch.tpu", "up", *RUN, "--mode=spot", "--",
          "--config.seed=1", "--dry-run"]  # --dry-run after `--` still counts
    out = subprocess.run(up, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert not calls.exists(), "dry run executed a command"
    text = out.stdout
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    order = [text.index(s) for s in ("queued-resources create spt", "queued-resources describe",
                                     "tpu-vm scp", "tpu-vm ssh spt")]
    assert order == sorted(order)
    assert "--config.seed=1" in text and "--dry-run" not in text.split("queued-resources")[1]

    sl = [sys.executable, "-m", "sptlib.launch.slurm", "--nodes=2", "--gpus-per-node=4",
          "--partition=gpu", "--time=02:00:00", "--config=experiments/pathx.py",
          "--workdir=gs://my-bucket/spt/pathx", "--python=/opt/venv/bin/python",
          f"--script-out={tmp_path}/job.sbatch", "--dry-run", "--", "--config.seed=2"]
    out = subprocess.run(sl, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert not calls.exists() and not (tmp_path / "job.sbatch").exists()
    text = out.stdout
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --time=02:00:00", "#SBATCH --partition=gpu", "#SBATCH --requeue"):
        assert line + "\n" in text
    srun = text[text.index("srun "):text.index("wait $!")]
    assert ("/opt/venv/bin/python -m sptlib.main --config=experiments/pathx.py "
            "--workdir=gs://my-bucket/spt/pathx --config.mesh.data=8") in " ".join(srun.split())
    assert "--config.seed=2" in srun
    assert text.rstrip().endswith(f"sbatch {tmp_path}/job.sbatch")


def test_slurm_mesh_must_match_gpus():
    args = slurm.parse_args(["--nodes=2", "--gpus-per-node=8", "--mesh=v4-32",
                             "--config=c.py", "--workdir=/shared/x"])
    with pytest.raises(ValueError, match="needs 8 devices, but the job has 2 x 8 = 16 GPUs"):
        slurm.render(args.__class__(**{**vars(args), "mesh": "gpu-8"}))
    text = slurm.render(args)  # v4-32 is 16 devices: allowed on 16 GPUs
    assert "--config.mesh.data=16" in text
    assert shlex.split(text.split("srun ", 1)[1].split("&\n")[0].replace("\\\n", " "))[3:5] == [
        "-m", "sptlib.main"]
