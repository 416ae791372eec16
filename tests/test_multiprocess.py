"""Two processes on loopback (jax.distributed, CPU/gloo) == one process with the same batch."""

import json
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "_mp_worker.py")
TIMEOUT = 300


def free_port():
    try:
        import portpicker  # pylint: disable=import-outside-toplevel
        return portpicker.pick_unused_port()
    except ImportError:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]


def _env():
    env = dict(os.environ)
    env.pop("JAX_NUM_CPU_DEVICES", None)
    env["JAX_PLATFORMS"] = "cpu"
    # Unoptimised XLA backend code compiles ~2x faster; all three processes use it.
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()
    return env


def _finish(procs):
    """Waits for all processes (bounded); kills every one still running on failure."""
    try:
        for p in procs:
            p.wait(timeout=TIMEOUT)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = [p.stderr.read() for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]


def test_two_processes_match_one(tmp_path):
    port = free_port()
    env = _env()
    procs = [subprocess.Popen([sys.executable, WORKER, str(tmp_path / "single.json"), "single"],
                              env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              text=True)]
    procs += [subprocess.Popen([sys.executable, WORKER, str(tmp_path / f"dist{i}.json"), "dist",
                                str(port), str(i)], env=env, stderr=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, text=True) for i in range(2)]
    _finish(procs)
    single = json.loads((tmp_path / "single.json").read_text())
    dist = [json.loads((tmp_path / f"dist{i}.json").read_text()) for i in range(2)]
    assert [d["process_index"] for d in dist] == [0, 1]
    assert all(d["process_count"] == 2 for d in dist) and single["process_count"] == 1
    assert [d["main"] for d in dist] == [True, False]
    # The parameters really are spread over the two processes (fsdp=2).
    assert all(d["sharded"] for d in dist)
    for d in dist:
        assert d["losses"] == pytest.approx(single["losses"], rel=1e-6)
        assert d["fingerprint"] == single["fingerprint"]
    assert len(set(single["losses"])) > 1
