"""Mesh construction, logical rules, batch sharding, and sharded == single-device training."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from sptlib.train import sharding

HERE = os.path.dirname(os.path.abspath(__file__))


def test_create_mesh_fills_and_checks_device_count():
    cfg = sharding.mesh_config()
    mesh = sharding.create_mesh(cfg)
    assert mesh.axis_names == ("data", "fsdp", "tensor")
    assert dict(mesh.shape) == {"data": jax.device_count(), "fsdp": 1, "tensor": 1}
    cfg.data, cfg.tensor = 3, 1
    with pytest.raises(ValueError, match=r"3 devices.*1 devices|needs 3 devices, but 1"):
        sharding.create_mesh(cfg, jax.devices()[:1])


def test_maybe_initialize_distributed_single_process_and_bad_config():
    cfg = sharding.mesh_config()
    sharding.maybe_initialize_distributed(cfg)  # nothing to do on one host
    assert jax.process_count() == 1
    cfg.coordinator_address = "127.0.0.1:1"
    with pytest.raises(ValueError, match="num_processes"):
        sharding.maybe_initialize_distributed(cfg)


def test_rules_map_logical_names():
    rules = sharding.normalize_rules([["batch", ["data", "fsdp"]], ["embed", "fsdp"],
                                      ["mlp", "tensor"], ["kv", None], ["norm", []]])
    assert rules[0] == ("batch", ("data", "fsdp"))
    assert rules[-1] == ("norm", None)
    assert sharding.batch_axes(rules) == ("data", "fsdp")
    assert sharding.batch_axes(sharding.default_rules()) == ("data", "fsdp")


def test_logical_to_sharding_replicates_uneven_dims():
    devices = np.array(jax.devices()[:1] * 1)
    mesh = jax.sharding.Mesh(devices.reshape(1, 1, 1), ("data", "fsdp", "tensor"))
    specs = {"a": P("embed", "mlp"), "b": P("vocab",), "c": None}
    shapes = {"a": np.zeros((4, 6)), "b": np.zeros((5,)), "c": np.zeros(())}
    out = sharding.logical_to_sharding(specs, shapes, mesh, sharding.default_rules())
    assert out["a"].spec == P("fsdp", "tensor")
    assert out["b"].spec == P("tensor")  # 5 % 1 == 0: kept
    assert out["c"].spec == P()


def test_shard_batch_single_process():
    mesh = sharding.create_mesh(sharding.mesh_config())
    batch = {"inputs": np.arange(12, dtype=np.int32).reshape(4, 3), "mask": np.ones((4, 3), bool)}
    out = sharding.shard_batch(batch, mesh, sharding.default_rules())
    assert out["inputs"].shape == (4, 3)
    assert out["inputs"].sharding.spec == P(("data", "fsdp"))
    np.testing.assert_array_equal(np.asarray(out["inputs"]), batch["inputs"])


@pytest.fixture(scope="module")
def eight_device_runs():
    # Unoptimised XLA backend code: compiles ~2x faster, same programs on every mesh.
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="8", JAX_PLATFORMS="cpu",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                          " --xla_backend_optimization_level=0").strip())
    proc = subprocess.run([sys.executable, os.path.join(HERE, "_mp_sharding.py")], env=env,
                          capture_output=True, text=True, timeout=400, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_sharded_losses_equal_single_device(eight_device_runs):
    ref = np.array(eight_device_runs["one"]["losses"])
    assert np.all(np.isfinite(ref)) and len(ref) == 6  # 5 train steps + an eval
    for name in ("dp_tp", "fsdp_tp"):
        got = np.array(eight_device_runs[name]["losses"])
        np.testing.assert_allclose(got, ref, rtol=1e-5, err_msg=name)


# The rules (default_rules) by hand: embed -> fsdp, mlp/heads/vocab/ssm_channels -> tensor.
HAND_RULES = {"embed": "fsdp", "mlp": "tensor", "heads": "tensor", "vocab": "tensor",
              "ssm_channels": "tensor"}
SIZES = {"dp_tp": {"data": 4, "fsdp": 1, "tensor": 2},
         "fsdp_tp": {"data": 1, "fsdp": 4, "tensor": 2}}


@pytest.mark.parametrize("name", ["dp_tp", "fsdp_tp"])
def test_parameter_shardings_follow_rules(eight_device_runs, name):
    run = eight_device_runs[name]
    assert run["batch_spec"] == [["data", "fsdp"]]
    sizes = SIZES[name]
    n_split = {"fsdp": 0, "tensor": 0}
    for pname, p in run["params"].items():
        used = set()
        for dim, (logical, size) in enumerate(zip(p["logical"], p["shape"])):
            axis = HAND_RULES.get(logical)
            if axis in used or axis is None:
                axis = None
            elif size % sizes[axis]:
                axis = None  # uneven dims stay whole
            used.add(axis)
            assert p["spec"][dim] == axis, (pname, p)
            # The device really holds only its slice.
            assert p["shard"][dim] == size // (sizes[axis] if axis else 1), (pname, p)
            if axis and sizes[axis] > 1:
                n_split[axis] += 1
    assert n_split["tensor"] > 0
    if name == "fsdp_tp":
        assert n_split["fsdp"] > 0
    # Optimizer moments of 2-D params are sharded like params, not replicated.
    assert "PartitionSpec()" not in run["mu_specs"] and "P()" not in run["mu_specs"]
