"""Mesh presets: device counts per slice, and real `jax.sharding.Mesh`es on fake CPU devices.

The CPU device count is fixed when JAX starts, so the mesh checks run in one subprocess with
JAX_NUM_CPU_DEVICES=32 (a v4-32 is 16 JAX devices: one per megacore chip; a 2 x v5e-16 layout
is 32 devices in 2 slices).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sptlib.slices import meshes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name, devices, hosts, data, dcn_data", [
    ("v4-8", 4, 1, 4, 1),        # 4 chips (8 TensorCores, megacore) on one host
    ("v4-32", 16, 4, 16, 1),
    ("v4-128", 64, 16, 64, 1),
    ("v5e-16", 16, 4, 16, 1),    # v5e names count chips; 4 chips per host
    ("v5litepod-16", 16, 4, 16, 1),
    ("v5e-8", 8, 1, 8, 1),       # v5e up to 8 chips is a single host
    ("2xv5e-16", 32, 8, 16, 2),
    ("gpu-8", 8, 1, 8, 1),
    ("2xgpu-8", 16, 2, 8, 2),
])
def test_preset_table(name, devices, hosts, data, dcn_data):
    acc = meshes.parse_accelerator(name)
    assert (acc.num_devices, acc.num_hosts) == (devices, hosts)
    assert meshes.expected_device_count(name) == devices
    cfg = meshes.mesh_preset(name)
    assert dict(cfg) == {"data": data, "fsdp": 1, "tensor": 1, "dcn_data": dcn_data,
                         "dcn_fsdp": 1}


def test_preset_splits_and_accelerator_names():
    cfg = meshes.mesh_preset("v4-128", fsdp=4, tensor=2)
    assert (cfg.data, cfg.fsdp, cfg.tensor) == (8, 4, 2)
    cfg = meshes.mesh_preset("2xv4-32", fsdp=16, dcn_axis="fsdp")
    assert (cfg.data, cfg.fsdp, cfg.dcn_data, cfg.dcn_fsdp) == (1, 16, 1, 2)
    assert meshes.parse_accelerator("v5e-16").accelerator_type == "v5litepod-16"
    assert meshes.parse_accelerator("v4-32").runtime_version == "tpu-ubuntu2204-base"
    assert meshes.expected_device_count("cpu") is None
    assert dict(meshes.mesh_preset("cpu"))["data"] == -1
    with pytest.raises(ValueError, match="must divide"):
        meshes.mesh_preset("v4-32", fsdp=3)
    with pytest.raises(ValueError, match="Unknown"):
        meshes.parse_accelerator("v9-32")
    with pytest.raises(ValueError, match="multiple of 2"):
        meshes.parse_accelerator("v4-7")


def test_wrong_device_count_names_both_numbers():
    cfg = meshes.mesh_preset("v4-32")
    with pytest.raises(ValueError, match=r"needs 16 devices, but 32 devices are available"):
        meshes.resolve_axis_sizes(cfg, 32)
    sizes = meshes.resolve_axis_sizes({"data": -1, "fsdp": 2, "tensor": 1, "dcn_data": 2,
                                       "dcn_fsdp": 1}, 32)
    assert sizes["data"] == 8
    assert meshes.config_overrides(cfg) == [
        "--config.mesh.data=16", "--config.mesh.fsdp=1", "--config.mesh.tensor=1",
        "--config.mesh.dcn_data=1", "--config.mesh.dcn_fsdp=1"]


_MESH_SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    from sptlib.slices import meshes
    out = {"n": jax.device_count()}
    devs = jax.devices()

    # v4-32: 16 devices, data-parallel; and with fsdp=4.
    m = meshes.build_mesh(meshes.mesh_preset("v4-32"), devs[:16])
    out["v4_32"] = list(m.devices.shape)
    m = meshes.build_mesh(meshes.mesh_preset("v4-32", fsdp=4), devs[:16])
    out["v4_32_fsdp"] = list(m.devices.shape)

    # Two slices over DCN (devices 0-15 = slice 0, 16-31 = slice 1 on one CPU process).
    m = meshes.build_mesh(meshes.mesh_preset("2xv5e-16", fsdp=2))
    out["2slice"] = list(m.devices.shape)
    ids = np.vectorize(lambda d: d.id)(m.devices)
    out["slice0"] = sorted(ids[:8].ravel().tolist())   # outer (DCN) half of the data axis
    out["slice1"] = sorted(ids[8:].ravel().tolist())
    # A psum over the mesh gives the plain sum: the mesh shards real computations.
    x = jnp.arange(32.0 * 4).reshape(32, 4)
    xs = jax.device_put(x, NamedSharding(m, P(("data", "fsdp"))))
    out["sum_ok"] = bool(jnp.allclose(jax.jit(jnp.sum)(xs), x.sum()))
    out["shard_rows"] = int(xs.addressable_shards[0].data.shape[0])

    # DCN on fsdp instead: each fsdp column block is one slice.
    m = meshes.build_mesh(meshes.mesh_preset("2xv5e-16", fsdp=4, dcn_axis="fsdp"))
    ids = np.vectorize(lambda d: d.id)(m.devices)
    out["dcn_fsdp_shape"] = list(m.devices.shape)
    out["dcn_fsdp_halves"] = [sorted(ids[:, :4].ravel().tolist()),
                              sorted(ids[:, 4:].ravel().tolist())]

    try:
        meshes.build_mesh(meshes.mesh_preset("v4-32"))
    except ValueError as e:
        out["wrong"] = str(e)

    # The engine's create_mesh, when present, accepts the presets and checks the count too.
    try:
        from sptlib.train import sharding
    except ImportError:
        out["engine"] = None
    else:
        out["engine"] = list(sharding.create_mesh(meshes.mesh_preset("v4-32"), devs[:16])
                             .devices.shape)
        try:
            sharding.create_mesh(meshes.mesh_preset("v4-32"))
        except ValueError as e:
            out["engine_wrong"] = str(e)
    print("JSON" + json.dumps(out))
""")


def test_presets_build_on_fake_cpu_devices():
    env = dict(os.environ, JAX_NUM_CPU_DEVICES="32", JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-c", _MESH_SCRIPT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("JSON", 1)[1])
    assert out["n"] == 32
    assert out["v4_32"] == [16, 1, 1]
    assert out["v4_32_fsdp"] == [4, 4, 1]
    assert out["2slice"] == [16, 2, 1]
    assert out["slice0"] == list(range(16)) and out["slice1"] == list(range(16, 32))
    assert out["sum_ok"] and out["shard_rows"] == 1
    assert out["dcn_fsdp_shape"] == [4, 8, 1]
    assert out["dcn_fsdp_halves"] == [list(range(16)), list(range(16, 32))]
    assert "needs 16 devices" in out["wrong"] and "32 devices" in out["wrong"]
    if out["engine"] is not None:
        assert out["engine"] == [16, 1, 1]
        assert "16" in out["engine_wrong"] and "32" in out["engine_wrong"]
