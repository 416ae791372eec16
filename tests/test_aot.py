"""Ahead-of-time compilation for TPU slices (sptlib.protocol.aot) and the pieces it trusts.

- The FLOP counter against XLA's own count of the same program unrolled, and hand counts.
- `build_stage(abstract=True)` against a real initialisation (shapes, dtypes, shardings).
- The slice table against `sptlib.slices.meshes` and libtpu's topology description.
- The CLI in a subprocess: the PathX Transformer pretrain step compiled at full size for a v4-8
  fits; plain (full L x L) attention at PathX is refused with one line; no libtpu: exit 2.
  The PathX S4 pretrain step compiled the same way (its FFT convolutions cost libtpu most of
  the compile time; `--effort=-1`, the default, keeps that to about a minute here).
- The fast compile (`--effort=-1`) against the pod's own (effort 0): same FLOPs, same argument
  and output bytes, temporaries never under-reported.
- The `--all` sweep is slow (about 17 minutes on 2 cores).

libtpu is part of the `test` extra: without it these tests fail, they do not skip.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.protocol import aot
from sptlib.slices import meshes, topologies
from sptlib.configs import presets, testing
from sptlib import data as data_lib
from sptlib.train import flops, setup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATHX_TRANSFORMER = "--config=experiments/lra.py:pathx,transformer,spt-masked"
PATHX_S4 = "--config=experiments/lra.py:pathx,s4,spt-masked"


def _require_libtpu():
    if importlib.util.find_spec("libtpu") is None:
        pytest.fail("libtpu is not installed: pip install -e '.[test]' (it is in the test extra)")


def _aot(*args, timeout=900):
    _require_libtpu()
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "sptlib.aot", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


def _errors(stderr):
    """Our lines on stderr (libtpu and absl log their own start-up lines there too)."""
    return [ln for ln in stderr.splitlines() if ln.startswith(("lra.py", "sptlib.aot"))]


# ---------------------------------------------------------------------------------------------
# FLOP counter


def test_flops_count_every_scan_iteration_like_the_unrolled_program():
    w = jnp.ones((64, 48))

    def scanned(x):
        y, _ = jax.lax.scan(lambda c, _: (jnp.tanh(c @ w @ w.T), None), x, None, length=7)
        return y

    def unrolled(x):
        for _ in range(7):
            x = jnp.tanh(x @ w @ w.T)
        return x

    x = jnp.ones((32, 64))
    xla = jax.jit(unrolled).lower(x).compile().cost_analysis()["flops"]
    matmuls = 7 * 2 * (2 * 32 * 64 * 48)  # two products per iteration, 2 FLOPs per MAC
    assert flops.jaxpr_flops(jax.make_jaxpr(scanned)(x).jaxpr) == matmuls
    assert xla == matmuls  # XLA counts tanh as a transcendental, not a FLOP
    # ... and XLA's count of the scanned program sees its body once.
    assert jax.jit(scanned).lower(x).compile().cost_analysis()["flops"] < xla / 3


def test_flops_cond_takes_the_larger_branch_and_fft_is_5nlogn():
    def f(x, p):
        y = jax.lax.cond(p, lambda v: v @ v.T @ v, lambda v: 2 * v, x)
        return jnp.fft.fft(y.astype(jnp.complex64), axis=-1)

    x = jnp.ones((16, 8))
    count = flops.jaxpr_flops(jax.make_jaxpr(f)(x, True).jaxpr)
    assert count == 2 * 16 * 16 * 8 + 2 * 16 * 8 * 16 + 5 * 8 * math.log2(8) * 16


# ---------------------------------------------------------------------------------------------
# Abstract stage build


def test_abstract_stage_matches_a_real_initialisation():
    config = testing.tiny(presets.build("listops", "transformer", "spt-masked"))
    info = data_lib.task_info(config.data)
    batch = setup.batch_shapes(info, int(config.stages.pretrain.batch_size))
    real_batch = {k: np.zeros(v.shape, v.dtype) for k, v in batch.items()}
    real = setup.build_stage(config, "pretrain", example_batch=real_batch, info=info)
    abstract = setup.build_stage(config, "pretrain", info=info, abstract=True)
    leaves = jax.tree_util.tree_leaves_with_path
    got = {jax.tree_util.keystr(p): x for p, x in leaves(abstract.state)}
    want = {jax.tree_util.keystr(p): x for p, x in leaves(real.state)}
    assert got.keys() == want.keys() and got
    for k, x in want.items():
        assert isinstance(got[k], jax.ShapeDtypeStruct), k
        assert (got[k].shape, got[k].dtype) == (x.shape, x.dtype), k
        assert got[k].sharding == x.sharding, k
    assert abstract.num_params == real.num_params
    # The abstract step lowers (the AOT path) and the counted FLOPs agree for both states.
    abstract.train_step.lower(abstract.state, abstract.example_batch)
    assert setup.train_step_flops(real) == setup.train_step_flops(abstract) > 0


# ---------------------------------------------------------------------------------------------
# Slice table


@pytest.mark.parametrize("name,topology,devices", [
    ("v4-8", "v4:2x2x1", 4), ("v4-32", "v4:2x2x4", 16), ("v4-1024", "v4:8x8x8", 512),
    ("v5e-1", "v5e:1x1", 1), ("v5e-16", "v5e:4x4", 16), ("v5e-256", "v5e:16x16", 256),
    ("v5p-8", "v5:2x2x1", 4), ("v5p-128", "v5:4x4x4", 64)])
def test_slice_table_agrees_with_meshes_and_libtpu(name, topology, devices):
    _require_libtpu()
    spec = topologies.slice_spec(name)
    assert (spec.topology, spec.num_devices) == (topology, devices)
    assert meshes.expected_device_count(name) == devices
    devs = topologies.devices(spec)
    assert len(devs) == devices and devs[0].platform == "tpu"
    assert spec.hbm_bytes == {"v4": 32, "v5e": 16, "v5p": 95}[spec.generation] * 2 ** 30


@pytest.mark.parametrize("name", ["v4-6", "v7-8", "2xv4-8", "gpu-8", "bogus"])
def test_unknown_slices_are_named_errors(name):
    with pytest.raises(ValueError, match=f"unknown TPU slice '{name}'.*v4-8"):
        topologies.slice_spec(name)


# ---------------------------------------------------------------------------------------------
# Compile effort


@pytest.mark.parametrize("task,model", [
    # Both slow (61 s and more idle): the default suite compiles a paper-size step in
    # test_cli_pathx_transformer_pretrain_fits_a_v4_8.
    pytest.param("image", "transformer", marks=pytest.mark.slow),
    pytest.param("pathfinder", "s4", marks=pytest.mark.slow)])
def test_fast_compile_reports_at_least_the_pods_memory_at_paper_size(task, model):
    # `--effort=-1` (the default) is what lets `--all` finish on a CPU host. At paper size the
    # memory it plans is more than a pod's own (effort 0) compile plans (less fusion), so a fit
    # it reports holds; the FLOPs and the argument / output / donated bytes are the same. (At
    # toy sizes the direction flips: there effort 0 spends more on temporaries and code, which is
    # why this runs the real config.) Two stages compile at once (threads); records keep the
    # grid's order.
    _require_libtpu()
    config = presets.build(task, model, "spt-masked")
    fast, failures = aot.run([("paper", config)], topology="v4-8", effort=-1.0, jobs=2,
                             emit=lambda line: None)
    full, _ = aot.run([("paper", config)], topology="v4-8", effort=0.0, jobs=1,
                      stage_only="pretrain", emit=lambda line: None)
    assert not failures
    assert [r["stage"] for r in fast] == ["pretrain", "finetune"]
    f, g = fast[0], full[0]
    assert (f["effort"], g["effort"]) == (-1.0, 0.0)
    assert f["flops_per_step"] == g["flops_per_step"] > 0
    for key in ("argument_bytes", "output_bytes", "alias_bytes"):
        assert f[key] == g[key], key
    assert f["total_bytes"] >= g["total_bytes"]
    assert f["eval_total_bytes"] >= g["eval_total_bytes"]


# ---------------------------------------------------------------------------------------------
# CLI


def test_cli_pathx_transformer_pretrain_fits_a_v4_8(tmp_path):
    out = _aot(PATHX_TRANSFORMER, "--config.model.attention.impl=local", "--topology=v4-8",
               "--stage=pretrain", f"--json={tmp_path / 'r.json'}")
    assert out.returncode == 0, out.stderr[-3000:]
    (rec,) = json.loads((tmp_path / "r.json").read_text())
    assert rec["fits"] and rec["slice"] == "v4-8" and rec["mesh"]["data"] == 4
    assert 0 < rec["total_bytes"] <= 32 * 2 ** 30 and rec["eval_total_bytes"] > 0
    assert rec["total_bytes"] == (rec["argument_bytes"] + rec["temp_bytes"]
                                  + rec["output_bytes"] - rec["alias_bytes"] + rec["code_bytes"])
    # The state is donated: the new state aliases the old one.
    assert rec["alias_bytes"] > 0.9 * rec["output_bytes"]
    # FLOPs: more than the dense layers' 6 x params x tokens (attention adds its band).
    tokens = 32 * 128 * 128
    assert rec["flops_per_step"] > 6 * rec["num_params"] * tokens
    # The assumed 40% MFU, capped by the compiler's bound: chip-hours at the assumption are
    # never fewer than at the bound.
    assert rec["mfu_assumed"] == 0.4 and rec["mfu"] == min(0.4, rec["bound_mfu"])
    assert rec["chip_hours"] == pytest.approx(
        rec["steps"] * rec["model_flops"] / (275e12 * min(0.4, rec["bound_mfu"])) / 3600)
    assert rec["chip_hours"] >= rec["chip_hours_bound"]
    assert "lra.py:pathx,transformer,spt-masked" in out.stdout and "pretrain" in out.stdout
    # The resolved stage (sptlib.train.resolve): bf16 compute and splash attention on a TPU,
    # and the compiler's step-time bound with the chip-hours it allows.
    assert rec["attention_kernel"] == "splash" and rec["dtype"] == "bfloat16"
    assert 0 < rec["bound_mfu"] < 1 and rec["bound_seconds"] > 0
    # The bound is model FLOPs over the best-case time of the step with its layers unrolled:
    # libtpu costs a scanned layer once, so the step as trained (scanned) looks faster.
    assert rec["bound_from"] == "unrolled"
    assert rec["scanned_bound_seconds"] < rec["bound_seconds"]
    assert rec["bound_mfu"] == pytest.approx(
        rec["model_flops"] / (rec["chips"] * rec["bound_seconds"] * 275e12))
    assert rec["chip_hours_bound"] == pytest.approx(
        rec["steps"] * rec["chips"] * rec["bound_seconds"] / 3600)
    # The kernels' extra work (the backward recomputes QK^T; blocks on the band's edge are
    # computed whole): compiler FLOPs above model FLOPs, though the preset has no remat.
    assert 1 < rec["compiler_ratio"] < 1.5
    assert "bound" in out.stdout and "MFU" in out.stdout


def test_cli_refuses_full_attention_at_pathx_in_one_line():
    # The preset's fixes undone: full L x L attention by the jnp reference (splash, the TPU
    # kernel, never forms the score matrix); without remat, as the preset.
    out = _aot(PATHX_TRANSFORMER, "--config.model.attention.impl=plain",
               "--config.model.attention.kernel=reference",
               "--config.model.attention.window=0", "--config.model.remat=False",
               "--topology=v4-8", "--stage=pretrain")
    assert out.returncode == 1
    (line,) = _errors(out.stderr)
    assert line.startswith("lra.py:pathx,transformer,spt-masked stage pretrain on v4-8")
    assert "32 GiB HBM" in line and "attention.impl='local'" in line and "remat" in line
    assert "attention.kernel='auto'" in line


def test_cli_bad_slice_and_mesh_are_clear_errors():
    out = _aot(PATHX_TRANSFORMER, "--topology=v4-7")
    assert out.returncode == 2 and "unknown TPU slice 'v4-7'" in out.stderr
    out = _aot(PATHX_TRANSFORMER, "--config.mesh.data=3", "--topology=v4-8", "--stage=pretrain")
    assert out.returncode == 1
    (line,) = _errors(out.stderr)
    assert "needs 3 devices, but 4 devices are available" in line


def test_without_libtpu_it_says_how_to_install(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "libtpu" else real(name, *a))
    with pytest.raises(SystemExit) as e:
        aot.main(["sptlib.protocol.aot"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == aot.INSTALL_HINT
    assert "pip install -e '.[tpu]'" in aot.INSTALL_HINT


# ~2 min (a TPU compile of S4 at L = 16k); the Transformer's Path-X test above keeps the CLI's
# fit check in the default suite, and test_all_paper_configs_compile covers S4 too.
@pytest.mark.slow
def test_cli_pathx_s4_pretrain_fits_a_v4_8(tmp_path):
    out = _aot(PATHX_S4, "--topology=v4-8", "--stage=pretrain", f"--json={tmp_path / 'r.json'}",
               timeout=1800)
    assert out.returncode == 0, out.stderr[-3000:]
    (rec,) = json.loads((tmp_path / "r.json").read_text())
    assert rec["fits"] and 0 < rec["total_bytes"] <= 32 * 2 ** 30


@pytest.mark.slow
def test_all_paper_configs_compile(tmp_path):
    out = _aot("--all", "--markdown", f"--json={tmp_path / 'all.json'}", timeout=7200)
    records = json.loads((tmp_path / "all.json").read_text())
    assert len(records) == 2 * len(aot.paper_configs())
    assert out.returncode == 0, "\n".join(_errors(out.stderr))
    assert out.stdout.count("\n| ") >= len(records)


def test_paper_configs_load_from_the_package():
    """`--all` reads every paper config from the packaged experiments (no repository
    root involved: tests/test_wheel.py runs `sptlib.aot` from an installed wheel)."""
    names = [name for name, _ in aot.paper_configs()]
    assert "lra.py:listops,transformer,spt-masked" in names
    assert len(names) == len(set(names)) >= 14
