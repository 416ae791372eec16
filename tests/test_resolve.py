"""The resolved run (`sptlib.train.resolve`): one object that training, AOT and the benchmark
build from, printed by `python -m sptlib.main --print_config`."""

import json
import os
import subprocess
import sys

import numpy as np

from sptlib import data as data_lib

from sptlib.slices import topologies
from sptlib.bench import train_step as bench_train_step
from sptlib.configs import common, presets
from sptlib.train import resolve, setup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _smoke():
    return common.load_module(os.path.join(ROOT, "experiments/smoke.py")).get_config()


def test_build_stage_builds_from_the_resolved_stage():
    config = _smoke()
    info = data_lib.task_info(config.data)
    resolved = resolve.resolve_stage(config, "pretrain", info=info)
    built = setup.build_stage(config, "pretrain", info=info, abstract=True)
    assert built.resolved.to_json() == resolved.to_json()
    assert dict(built.mesh.shape) == dict(resolved.mesh.shape)
    assert {k: (tuple(v.shape), np.dtype(v.dtype).name)
            for k, v in built.example_batch.items()} == resolved.batch
    assert resolved.platform == "cpu" and resolved.model_cfg.dtype == "float32"
    assert resolved.attention_kernel in ("cpu", "reference")  # C++ kernel where it compiled


def test_aot_and_benchmark_build_the_same_resolved_stage():
    """The AOT compile for a v4 slice and the benchmark's step carry the resolved stage they
    were built from: TPU -> bf16 and splash attention; here -> what training resolves."""
    config = presets.build("text", "transformer", "spt-masked")
    spec = topologies.slice_spec("v4-8")
    devices = topologies.devices(spec)
    info = data_lib.task_info(config.data)
    tpu = resolve.resolve_stage(config, "pretrain", devices=devices, info=info)
    assert (tpu.platform, tpu.model_cfg.dtype, tpu.attention_kernel) == ("tpu", "bfloat16",
                                                                         "splash")
    assert tpu.mesh.shape["data"] == 4 and tpu.batch["inputs"][0][0] == 32
    built = setup.build_stage(config, "pretrain", info=info, devices=devices, abstract=True)
    assert built.resolved.to_json() == tpu.to_json()

    prepared = bench_train_step.prepare("smoke.py", stage_name="pretrain")
    assert prepared["built"].resolved.to_json() == resolve.resolve_stage(
        prepared["config"], "pretrain", info=prepared["info"]).to_json()


def test_print_config_prints_every_stage_and_exits(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sptlib.main", "--config=experiments/smoke.py",
                          "--print_config"], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert out.returncode == 0, out.stderr[-2000:]
    stages = json.loads(out.stdout)
    assert [s["stage"] for s in stages] == list(_smoke().stage_order)
    first = stages[0]
    assert first["platform"] == "cpu" and first["mesh"]["data"] == first["devices"]
    assert first["batch"]["inputs"] == [[16, 128], "int32"]
    assert first["model"]["dtype"] == "float32" and first["model"]["attention"]["kernel_chosen"]
    assert not list(tmp_path.iterdir())  # nothing written


def test_causal_spt_then_bidirectional_finetune_in_the_resolved_stages():
    """A stage's `causal` overrides `model.causal`: the causal-SPT preset pretrains causally
    and finetunes (and AOT-compiles the finetune) bidirectionally, as the release does."""
    config = presets.build("pathx", "transformer-causal", "spt-causal")
    info = data_lib.task_info(config.data)
    pre = resolve.resolve_stage(config, "pretrain", info=info)
    fin = resolve.resolve_stage(config, "finetune", info=info)
    assert pre.model_cfg.causal is True and fin.model_cfg.causal is False
    assert config.model.causal is True  # the config itself is not changed
