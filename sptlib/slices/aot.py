r"""Compile a config's train and eval steps for a TPU slice on this machine (no TPU needed).

    python -m sptlib.aot --config=experiments/lra.py:pathx,transformer,spt-masked --topology=v4-32
    python -m sptlib.aot --all --markdown          # every paper config, each at its config's slice

For each stage, `sptlib.train.setup.build_stage` builds the stage exactly as training does (model,
objective, optimizer, mesh, logical rules, shardings, state donation), but abstractly
(`ShapeDtypeStruct`s, nothing allocated) on the devices of the named slice, taken from libtpu's
topology description; XLA then compiles the real train step and eval step for those TPUs. The
compile reports what the pod would see: memory per chip (arguments, temporaries, outputs, the
aliased i.e. donated bytes) against the chip's HBM, or the out-of-memory error itself. FLOPs per
step are counted from the traced step with every loop's trip count (`sptlib.train.flops`; XLA's
own count, which sees a loop body once, is kept as `xla_flops`). Chip-hours of a stage =
steps × FLOPs per step / (peak bf16 FLOP/s per chip × MFU), given as a range: at the compiler's
bound (`compiler_bound`: libtpu's cost model of the compiled step, the fewest chip-hours it
allows) and at `--mfu` (a labelled assumption, 40% by default, capped by the bound: no step
beats the compiler's best case).

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
from sptlib.configs import common
from sptlib.train import flops, setup

INSTALL_HINT = ("sptlib.slices.aot needs libtpu to compile for TPUs (this machine needs no TPU): "
                "install sptlib's tpu extra (pip install -e '.[tpu]' in a clone, "
                "'sptlib-<version>-py3-none-any.whl[tpu]' from a wheel) or "
                "pip install 'libtpu==0.0.42.*'")
# The paper grid of `--all`: experiment file, its argument prefix, tasks (None: no task slot).
PAPER_GRID = (("lra.py", ("listops", "text", "retrieval", "image", "pathfinder", "pathx",
                          "pathx256")),
              ("scifar.py", (None,)), ("speech_commands.py", (None,)))
PAPER_MODELS = ("transformer", "s4")
PAPER_REGIME = "spt-masked"  # pretrain + finetune; scratch compiles to the finetune step
from sptlib.slices.aot_flags import FAST_EFFORT, define_flags  # noqa: F401 (re-exported)


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


def _gib(n):
    return n / topologies.GIB


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


def compile_stage(name, config, stage_name, spec, devices, mfu, effort=FAST_EFFORT):
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
    eval_batch = setup.batch_shapes(built.info, int(stage.eval_batch_size or stage.batch_size),
                                    sharding=built.example_batch["mask"].sharding)
    rec = {"config": name, "stage": stage_name, "slice": spec.name, "chips": spec.num_devices,
           "mesh": dict(built.mesh.shape), "batch_size": int(stage.batch_size),
           "objective": stage.objective.kind, "task": config.data.task,
           "model": config.model.mixer, "steps": int(stage.num_steps),
           "hbm_bytes": spec.hbm_bytes, "num_params": built.num_params,
           "dtype": built.resolved.model_cfg.dtype,
           "attention_kernel": built.resolved.attention_kernel}
    for kind, step, batch in (("train", built.train_step, built.example_batch),
                              ("eval", built.eval_step, eval_batch)):
        try:
            compiled = step.lower(built.state, batch).compile(
                compiler_options={"exec_time_optimization_effort": float(effort)})
        except Exception as e:  # noqa: BLE001 - XLA reports OOM as a runtime error
            msg = str(e)
            if "RESOURCE_EXHAUSTED" not in msg and "Ran out of memory" not in msg:
                raise
            need = re.search(r"\(([\d.]+[KMGT]?)\) exceeds", msg)
            raise DoesNotFit(
                f"{where}: the {kind} step needs {_xla_bytes(need)} "
                f"per chip, more than the {_gib(spec.hbm_bytes):.0f} GiB HBM of a "
                f"{spec.generation} chip; use "
                f"{_advice(config, stage_name, spec, mesh_batch, effort)}") \
                from None
        mem = _memory(compiled)
        if kind == "train":
            rec.update(mem)
            rec["flops_per_step"] = flops.step_flops(step, built.state, batch)
            rec.update(compiler_bound(compiled.cost_analysis(), spec))
        else:
            rec["eval_total_bytes"] = mem["total_bytes"]
    rec["compile_s"] = round(time.perf_counter() - t0, 1)
    # An assumed MFU above the compiler's bound is impossible: the assumption is capped by it,
    # so the two figures always form a range (bound <= assumed).
    rec["mfu"] = min(mfu, rec["bound_mfu"]) if rec.get("bound_mfu") else mfu
    rec["mfu_assumed"] = mfu
    rec["chip_hours"] = (rec["steps"] * rec["flops_per_step"]
                         / (spec.peak_flops * rec["mfu"]) / 3600.0)
    # The fewest chip-hours the compiler's cost model allows (None without an estimate).
    rec["chip_hours_bound"] = (rec["steps"] * rec["flops_per_step"]
                               / (spec.peak_flops * rec["bound_mfu"]) / 3600.0
                               if rec.get("bound_mfu") else None)
    rec["effort"] = float(effort)
    worst = max(rec["total_bytes"], rec["eval_total_bytes"])
    rec["fits"] = worst <= spec.hbm_bytes
    if not rec["fits"]:
        raise DoesNotFit(
            f"{where}: {_gib(worst):.1f} GiB per chip (arguments {_gib(rec['argument_bytes']):.1f},"
            f" temporaries {_gib(rec['temp_bytes']):.1f}) > {_gib(spec.hbm_bytes):.0f} GiB HBM; "
            f"use {_advice(config, stage_name, spec, mesh_batch, effort)}")
    return rec


def compiler_bound(cost, spec):
    """The compiler's step-time bound from `compiled.cost_analysis()` (per chip).

    libtpu's cost model gives `flops` and `optimal_seconds` for one chip's program: the time of
    the step if every op ran at its roofline (peak FLOP/s or HBM bandwidth, whichever binds),
    with no stalls, no imperfect overlap and no launch overheads. A scanned loop's body counts
    once in both, so `bound_mfu = flops / (optimal_seconds x peak bf16 FLOP/s)` is an upper
    bound on the MFU the step can reach (not a prediction). A Pallas call without a cost
    estimate has no cost (every sptlib Pallas call sets one); a negative or missing
    `optimal_seconds` means no estimate (e.g. `--effort=0`), recorded as None.
    """
    cost = cost or {}
    chip_flops = float(cost.get("flops", 0.0))
    seconds = float(cost.get("optimal_seconds", -1.0))
    ok = seconds > 0 and chip_flops > 0
    return {"xla_flops": chip_flops * spec.num_devices if cost else None,
            "bound_seconds": seconds if ok else None,
            "bound_mfu": chip_flops / (seconds * spec.peak_flops) if ok else None}


def _pct(x):
    return f"{x:.1%}" if x is not None else "n/a"


def format_row(r) -> str:
    capped = "assumed" if r["mfu"] == r.get("mfu_assumed", r["mfu"]) else "capped by the bound"
    return (f"{r['config']:<45} {r['stage']:<9} {r['slice']:<7} "
            f"{_gib(r['total_bytes']):6.1f}/{_gib(r['hbm_bytes']):.0f} GiB "
            f"(args {_gib(r['argument_bytes']):.2f}, temp {_gib(r['temp_bytes']):.2f}, "
            f"out {_gib(r['output_bytes']):.2f}, aliased {_gib(r['alias_bytes']):.2f}; "
            f"eval {_gib(r['eval_total_bytes']):.1f}) {r['flops_per_step'] / 1e12:8.2f} TFLOP/step "
            f"{r['steps']:>8} steps; bound {_pct(r.get('bound_mfu'))} MFU, chip-h "
            f"{_hours(r.get('chip_hours_bound'))} (bound) / {r['chip_hours']:.1f} (at "
            f"{r['mfu']:.0%} MFU, {capped})  compile {r['compile_s']:.0f} s")


def _hours(h):
    return f"{h:,.1f}" if h is not None else "n/a"


def markdown(records, mfu) -> str:
    """The docs/reproducing.md table: one row per task x model x stage."""
    lines = [f"| task | model | stage | slice | memory/chip / HBM | step FLOPs | steps | "
             f"compiler bound: MFU | chip-hours: bound | chip-hours at {mfu:.0%} MFU "
             "(assumed; the bound where lower) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['config']} | | {r['stage']} | {r.get('slice', '')} | "
                         f"does not fit: {r['error']} | | | | | |")
            continue
        lines.append(f"| {r['task']} | {r['model']} | {r['stage']} | {r['slice']} | "
                     f"{_gib(max(r['total_bytes'], r['eval_total_bytes'])):.1f} / "
                     f"{_gib(r['hbm_bytes']):.0f} GiB | {r['flops_per_step']:.3g} | "
                     f"{r['steps']:,} | {_pct(r.get('bound_mfu'))} | "
                     f"{_hours(r.get('chip_hours_bound'))} | {_hours(r['chip_hours'])} |")
    return "\n".join(lines)


def run(configs, *, topology="", stage_only="", mfu=0.4, effort=FAST_EFFORT, jobs=1,
        emit=print, warn=None, on_record=None):
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
                                 effort)
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
        print(f"sptlib.slices.aot: error: unexpected arguments {argv[1:]}: every input is a "
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
        print("sptlib.slices.aot: error: pass --config=experiments/X.py[:arg] or --all",
              file=sys.stderr)
        sys.exit(2)
    try:
        if FLAGS.topology:
            topologies.slice_spec(FLAGS.topology)  # a bad name fails before any compile
        records, failures = run(configs, topology=FLAGS.topology, stage_only=FLAGS.stage,
                                mfu=FLAGS.mfu, effort=FLAGS.effort,
                                jobs=FLAGS.jobs or len(compare_jobs.usable_cores()),
                                on_record=_write_json if FLAGS.json else None)
    except ValueError as e:  # a bad --topology, config or stage name: bad input
        print(f"sptlib.slices.aot: error: {e}", file=sys.stderr)
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


def cli():
    """Command-line entry point (`python -m sptlib.aot`): `sptlib.aot.cli`."""
    from sptlib import aot as command  # pylint: disable=import-outside-toplevel
    command.cli()


if __name__ == "__main__":
    cli()
