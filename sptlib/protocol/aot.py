r"""Compile a config's train and eval steps for a TPU slice on this machine (no TPU needed).

    python -m sptlib.aot --config=experiments/lra.py:pathx,transformer,spt-masked --topology=v4-32
    python -m sptlib.aot --all --markdown          # every paper config, each at its config's slice

For each stage, `sptlib.train.setup.build_stage` builds the stage exactly as training does (model,
objective, optimizer, mesh, logical rules, shardings, state donation), but abstractly
(`ShapeDtypeStruct`s, nothing allocated) on the devices of the named slice, taken from libtpu's
topology description; XLA then compiles the real train step and eval step for those TPUs. The
compile reports what the pod would see: memory per chip (arguments, temporaries, outputs, the
aliased i.e. donated bytes) against the chip's HBM, or the out-of-memory error itself.

Utilisation, as PaLM counts it. `model_flops` is the useful work of one train step
(`sptlib.train.flops.stage_model_flops`: 6 x non-embedding parameters x tokens + 12 x sequences x
attended (query, key) pairs x attention width x attention layers; pairs L^2 bidirectional,
L(L+1)/2 causal, the band of a local window). `bound_seconds` is libtpu's best-case time of the
train step (`optimal_seconds` of `compiled.cost_analysis()`, per chip: every op at its
roofline, perfect overlap). libtpu costs a scanned loop's body once but the rest of the step in
full, so a step whose layers run under `nn.scan` is compiled a second time with its layers
unrolled (`model.scan_layers=False`) for the estimate; memory is the scanned step's, as trained.
Then `bound_mfu = model_flops / (chips x bound_seconds x peak bf16 FLOP/s)`, the most model FLOP
utilisation the step can reach, and `compiler_ratio = XLA's FLOPs / model_flops` (how much
remat recomputation and declared Pallas work the step adds; 1.33 is one full recomputation of
the dense layers). Chip-hours of a stage from the same time: steps x chips x bound_seconds at the
bound, and steps x model_flops / (peak x MFU) at `--mfu` (a labelled assumption, 40% by default,
capped by the bound). `flops_per_step` is the traced program's count with every loop's trip
count (`sptlib.train.flops.step_flops`; a Pallas call's work is invisible to it).

Exit status: 0 when every stage fits, 1 otherwise (one line per failing stage on stderr, naming
the config, the stage, bytes per chip, the HBM and what to change), 2 without libtpu (install
sptlib's `tpu` extra).
"""

from __future__ import annotations

import concurrent.futures
import copy
import importlib.util
import json
import os
import re
import sys
import time

import jax
from absl import flags
from ml_collections import config_flags

from sptlib import data as data_lib
from sptlib.protocol import compare_jobs
from sptlib.slices import meshes, topologies
from sptlib.protocol.utilisation import (  # noqa: F401 - part of this module's API
    _gib, compiler_bound, format_row, markdown, utilisation)
from sptlib.configs import common
from sptlib.train import flops, setup

INSTALL_HINT = ("sptlib.aot needs libtpu to compile for TPUs (this machine needs no TPU): "
                "install sptlib's tpu extra (pip install -e '.[tpu]' in a clone, "
                "'sptlib-<version>-py3-none-any.whl[tpu]' from a wheel) or "
                "pip install 'libtpu==0.0.42.*'")
# The paper grid of `--all`: experiment file, its argument prefix, tasks (None: no task slot).
PAPER_GRID = (("lra.py", ("listops", "text", "retrieval", "image", "pathfinder", "pathx",
                          "pathx256")),
              ("scifar.py", (None,)), ("speech_commands.py", (None,)))
PAPER_MODELS = ("transformer", "s4")
PAPER_REGIME = "spt-masked"  # pretrain + finetune; scratch compiles to the finetune step
from sptlib.protocol.aot_flags import FAST_EFFORT, define_flags  # noqa: F401 (re-exported)


class DoesNotFit(Exception):
    """A stage does not compile for (or fit) its slice; the message is one line."""


def paper_configs():
    """[(name, config)] of the paper grid (see PAPER_GRID)."""
    out = []
    for file, tasks in PAPER_GRID:
        module = common.load_module(os.path.join(common.EXPERIMENTS_DIR, file))  # packaged
        for task in tasks:
            for model in PAPER_MODELS:
                arg = ",".join(x for x in (task, model, PAPER_REGIME) if x)
                out.append((f"{file}:{arg}", module.get_config(arg)))
    return out


def _advice(config, stage_name, spec, mesh_batch, effort=0.0):
    """What to change when a stage does not fit (one clause per applicable fix)."""
    m, fixes, stage = config.model, [], config.stages[stage_name]
    uses_attention = m.mixer == "attention" or m.pattern == "gss_hybrid"
    if uses_attention and m.attention.get("kernel", "auto") == "reference":
        fixes.append("the platform's fused attention (config.model.attention.kernel='auto')")
    if uses_attention and m.attention.impl == "plain":
        fixes.append("local or chunked attention (config.model.attention.impl='local' with "
                     "attention.window, or 'chunked')")
    if not m.remat:
        fixes.append("rematerialisation (config.model.remat=True)")
    per_chip = int(stage.batch_size) // max(1, mesh_batch)
    if per_chip > 1:
        fixes.append(f"a smaller per-chip batch (now {per_chip}: "
                     f"stages.{stage_name}.batch_size)")
    fixes.append(f"a larger slice than {spec.name} (--topology / config.aot.slice)")
    if effort < 0:
        fixes.append(f"or check with --effort=0 (the pod's own compile; --effort={effort:g} "
                     "plans more memory)")
    return "; ".join(fixes)


def _xla_bytes(match):
    """XLA's '246.11G' (binary units) as '246.11 GiB'."""
    if not match:
        return "more"
    n = match.group(1)
    return f"{n[:-1]} {n[-1]}iB" if n[-1] in "KMGT" else f"{n} bytes"


def _memory(compiled):
    ma = compiled.memory_analysis()
    rec = {"argument_bytes": int(ma.argument_size_in_bytes),
           "temp_bytes": int(ma.temp_size_in_bytes),
           "output_bytes": int(ma.output_size_in_bytes),
           "alias_bytes": int(ma.alias_size_in_bytes),
           "code_bytes": int(ma.generated_code_size_in_bytes)}
    # Donated (aliased) outputs reuse their arguments' buffers.
    rec["total_bytes"] = (rec["argument_bytes"] + rec["temp_bytes"] + rec["output_bytes"]
                          - rec["alias_bytes"] + rec["code_bytes"])
    return rec


def _on_slice(config):
    """A copy of `config` with its mesh as on the target slice (`meshes.slice_mesh`)."""
    mesh = meshes.slice_mesh(config)
    if mesh.to_dict() == config.mesh.to_dict():
        return config
    config = copy.deepcopy(config)
    config.mesh.update(mesh.to_dict())
    return config


def compile_stage(name, config, stage_name, spec, devices, mfu, effort=FAST_EFFORT,
                  estimate="unrolled"):
    """The record of one stage (see the module docstring); raises DoesNotFit."""
    stage = config.stages[stage_name]
    where = f"{name} stage {stage_name} on {spec.name}"
    t0 = time.perf_counter()
    try:
        built = setup.build_stage(config, stage_name, info=data_lib.task_info(config.data),
                                  devices=devices, abstract=True)
    except ValueError as e:  # mesh sizes vs the slice's devices
        raise DoesNotFit(f"{where}: {e}") from None
    mesh_batch = built.mesh.shape["data"] * built.mesh.shape["fsdp"]
    for field in ("batch_size", "eval_batch_size"):
        if stage[field] and stage[field] % mesh_batch:
            raise DoesNotFit(
                f"{where}: stages.{stage_name}.{field}={stage[field]} does not divide over the "
                f"{mesh_batch} data-parallel chips (mesh {dict(built.mesh.shape)}); use a "
                f"multiple of {mesh_batch} or another config.mesh")
    eval_batch = setup.batch_shapes(built.info, built.resolved.eval_batch_size,
                                    sharding=built.example_batch["mask"].sharding)
    rec = {"config": name, "stage": stage_name, "slice": spec.name, "chips": spec.num_devices,
           "mesh": dict(built.mesh.shape), "batch_size": built.resolved.batch_size,
           "objective": stage.objective.kind, "task": config.data.task,
           "model": config.model.mixer, "steps": int(stage.num_steps),
           "hbm_bytes": spec.hbm_bytes, "num_params": built.num_params,
           "dtype": built.resolved.model_cfg.dtype,
           "attention_kernel": built.resolved.attention_kernel}
    model = flops.stage_model_flops(config, stage_name, built.model_cfg, built.state.params)
    rec.update(model_flops=model["model_flops"], model_attention_flops=model["attention_flops"],
               attended_pairs=model["pairs"], tokens=model["tokens"])
    for kind, step, batch in (("train", built.train_step, built.example_batch),
                              ("eval", built.eval_step, eval_batch)):
        compiled = _compile(step, built.state, batch, effort, kind, where, config, stage_name,
                            spec, mesh_batch)
        mem = _memory(compiled)
        if kind == "train":
            rec.update(mem)
            rec["flops_per_step"] = flops.step_flops(step, built.state, batch)
            scanned = compiler_bound(compiled.cost_analysis(), spec)
        else:
            rec["eval_total_bytes"] = mem["total_bytes"]
    rec["scanned_bound_seconds"] = scanned["bound_seconds"]
    if estimate == "unrolled" and _scans_layers(config):
        rec["bound_from"] = "unrolled"
        unrolled = copy.deepcopy(config)
        unrolled.model.scan_layers = False
        ub = setup.build_stage(unrolled, stage_name, info=built.info, devices=devices,
                               abstract=True)
        try:
            compiled = _compile(ub.train_step, ub.state, ub.example_batch, effort, "train",
                                where, config, stage_name, spec, mesh_batch)
            rec.update(compiler_bound(compiled.cost_analysis(), spec))
        except DoesNotFit:  # unrolled, more is live at once: no estimate (the stage still fits)
            rec.update(xla_flops=None, bound_seconds=None)
    else:
        rec["bound_from"] = "as compiled"
        rec.update(scanned)
    rec.update(utilisation(rec, spec, mfu))
    rec["compile_s"] = round(time.perf_counter() - t0, 1)
    rec["effort"] = float(effort)
    worst = max(rec["total_bytes"], rec["eval_total_bytes"])
    rec["fits"] = worst <= spec.hbm_bytes
    if not rec["fits"]:
        raise DoesNotFit(
            f"{where}: {_gib(worst):.1f} GiB per chip (arguments {_gib(rec['argument_bytes']):.1f},"
            f" temporaries {_gib(rec['temp_bytes']):.1f}) > {_gib(spec.hbm_bytes):.0f} GiB HBM; "
            f"use {_advice(config, stage_name, spec, mesh_batch, effort)}")
    return rec


def _scans_layers(config):
    m = config.model
    return bool(m.get("scan_layers", True)) and int(m.n_layers) > 1 and m.pattern == "uniform"


def _compile(step, state, batch, effort, kind, where, config, stage_name, spec, mesh_batch):
    """`step` compiled for the slice; an out-of-memory compile raises DoesNotFit (one line)."""
    try:
        return step.lower(state, batch).compile(
            compiler_options={"exec_time_optimization_effort": float(effort)})
    except Exception as e:  # noqa: BLE001 - XLA reports OOM as a runtime error
        msg = str(e)
        if "RESOURCE_EXHAUSTED" not in msg and "Ran out of memory" not in msg:
            raise
        need = re.search(r"\(([\d.]+[KMGT]?)\) exceeds", msg)
        raise DoesNotFit(
            f"{where}: the {kind} step needs {_xla_bytes(need)} per chip, more than the "
            f"{_gib(spec.hbm_bytes):.0f} GiB HBM of a {spec.generation} chip; use "
            f"{_advice(config, stage_name, spec, mesh_batch, effort)}") from None


def run(configs, *, topology="", stage_only="", mfu=0.4, effort=FAST_EFFORT, jobs=1,
        emit=print, warn=None, on_record=None, estimate="unrolled"):
    """Compiles every stage of every `(name, config)`; returns (records, failure lines).

    `jobs` stages compile at once, in threads (XLA compiles without holding the GIL, so two
    threads use two cores); records and output keep the grid's order whatever finishes first.
    `on_record(records)` is called after each stage (a long sweep keeps what it has)."""
    warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
    failures, device_cache, tasks = [], {}, []
    for name, config in configs:  # every name, slice and stage is checked before compiling
        slice_name = topology or config.aot.slice
        if not slice_name:
            failures.append(f"{name}: no TPU slice: pass --topology or set config.aot.slice")
            warn(failures[-1])
            continue
        spec = topologies.slice_spec(slice_name)
        config = _on_slice(config)
        if spec.name not in device_cache:
            device_cache[spec.name] = topologies.devices(spec)
        stages = [stage_only] if stage_only else list(config.stage_order)
        for stage_name in stages:
            if stage_name not in config.stages:
                raise ValueError(f"{name}: no stage {stage_name!r}; stages: "
                                 f"{sorted(config.stages)}")
            tasks.append((name, config, stage_name, spec))

    def one(task):
        name, config, stage_name, spec = task
        try:
            return compile_stage(name, config, stage_name, spec, device_cache[spec.name], mfu,
                                 effort, estimate)
        except DoesNotFit as e:
            return {"config": name, "stage": stage_name, "slice": spec.name, "error": str(e),
                    "fits": False}

    records = []
    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        for future in [pool.submit(one, t) for t in tasks]:
            rec = future.result()
            if "error" in rec:
                failures.append(rec["error"])
                warn(rec["error"])
            else:
                emit(format_row(rec))
            records.append(rec)
            if on_record:
                on_record(records)
    return records, failures


def main(argv):
    FLAGS = flags.FLAGS  # noqa: N806
    if len(argv) > 1:
        print(f"sptlib.aot: error: unexpected arguments {argv[1:]}: every input is a "
              f"--flag", file=sys.stderr)
        sys.exit(2)
    if importlib.util.find_spec("libtpu") is None:
        print(INSTALL_HINT, file=sys.stderr)
        sys.exit(2)
    # Compile-only TPU devices come from libtpu's topology API (sptlib.slices.topologies); this process
    # never opens a TPU (there may be none), and skips libtpu's attempt to.
    jax.config.update("jax_platforms", "cpu")
    if FLAGS.all:
        configs = [(n, c) for n, c in paper_configs() if re.search(FLAGS.match, n)]
    elif FLAGS.config is not None:
        configs = [(_config_name(), FLAGS.config)]
    else:
        print("sptlib.aot: error: pass --config=experiments/X.py[:arg] or --all",
              file=sys.stderr)
        sys.exit(2)
    try:
        if FLAGS.topology:
            topologies.slice_spec(FLAGS.topology)  # a bad name fails before any compile
        records, failures = run(configs, topology=FLAGS.topology, stage_only=FLAGS.stage,
                                mfu=FLAGS.mfu, effort=FLAGS.effort, estimate=FLAGS.estimate,
                                jobs=FLAGS.jobs or len(compare_jobs.usable_cores()),
                                on_record=_write_json if FLAGS.json else None)
    except ValueError as e:  # a bad --topology, config or stage name: bad input
        print(f"sptlib.aot: error: {e}", file=sys.stderr)
        sys.exit(2)
    if FLAGS.markdown:
        print(markdown(records, FLAGS.mfu))
    sys.exit(1 if failures else 0)


def _write_json(records):
    with open(flags.FLAGS.json, "w") as f:
        json.dump(records, f, indent=2, sort_keys=True)


def _config_name():
    """`lra.py:pathx,transformer,spt-masked` from the --config flag (path shortened)."""
    return os.path.basename(config_flags.get_config_filename(flags.FLAGS["config"]))
