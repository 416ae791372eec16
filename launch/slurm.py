"""Slurm launcher for GPU clusters: renders `slurm.sbatch` (beside it) and submits it with `sbatch`.

    python -m sptlib.launch.slurm --nodes=2 --gpus-per-node=8 --time=24:00:00 --partition=gpu \
        --config=experiments/lra.py:pathx,s4,spt-masked --workdir=/shared/runs/pathx_s4 \
        [--dry-run] [-- --config.stages.finetune.num_steps=1000]

One process per GPU (`--ntasks-per-node` = GPUs per node); `jax.distributed.initialize()`
finds the coordinator, process count and rank in Slurm's environment, and each process drives
GPU number SLURM_LOCALID. The mesh preset defaults to one data axis over all GPUs (`gpu-16`
for 2 x 8); `--mesh=2xgpu-8` puts a DCN data axis across nodes. `--dry-run` prints the rendered batch script and the `sbatch`
command and runs nothing. Re-submitting the same command resumes from the workdir's latest
checkpoint; the job also requeues itself 2 minutes before its time limit.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shlex
import sys
import tempfile
from typing import Sequence

from sptlib.launch import common
from sptlib.slices import meshes

TEMPLATE = pathlib.Path(__file__).with_name("slurm.sbatch")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sptlib.launch.slurm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="experiment config, relative to the checkout")
    p.add_argument("--workdir", required=True,
                   help="shared by all nodes: gs://BUCKET/PATH or a shared file system path")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--cpus-per-task", type=int, default=8)
    p.add_argument("--time", default="24:00:00")
    p.add_argument("--partition", default="")
    p.add_argument("--account", default="")
    p.add_argument("--qos", default="")
    p.add_argument("--sbatch-flag", action="append", default=[],
                   help="extra #SBATCH line content, e.g. --constraint=a100")
    p.add_argument("--job-name", default="", help="default: workdir basename")
    p.add_argument("--chdir", "--checkout", dest="chdir", default=os.getcwd(),
                   help="folder the job starts in on the nodes (default: this one); relative "
                   "paths resolve there. The packaged experiments/ configs need no checkout")
    p.add_argument("--python", default=sys.executable, help="python of the venv on the nodes")
    p.add_argument("--log-dir", default="", help="default: CHDIR/slurm-logs")
    p.add_argument("--mesh", default="", help="mesh preset (default gpu-N / Mxgpu-N), or none")
    p.add_argument("--fsdp", type=int, default=1)
    p.add_argument("--tensor", type=int, default=1)
    p.add_argument("--mem-fraction", default="0.9")
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE exported in the job")
    p.add_argument("--script-out", default="",
                   help="where to write the rendered script (default: a temp file)")
    p.add_argument("--dry-run", action="store_true", help="print script and sbatch, run nothing")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
        if "--dry-run" in extra:  # sptlib.main has no --dry-run; keep its meaning here
            extra.remove("--dry-run")
            argv.append("--dry-run")
    args = build_parser().parse_args(argv)
    args.extra = extra
    if args.nodes < 1 or args.gpus_per_node < 1:
        raise SystemExit("--nodes and --gpus-per-node must be >= 1")
    args.job_name = args.job_name or args.workdir.rstrip("/").rsplit("/", 1)[-1] or "spt"
    args.log_dir = args.log_dir or os.path.join(args.chdir, "slurm-logs")
    return args


def mesh_name(args) -> str:
    if args.mesh:
        return args.mesh
    # One flat data axis over every GPU: works with any create_mesh (no slice_index needed);
    # pass --mesh=Mxgpu-N for a hybrid (DCN across nodes) layout.
    return f"gpu-{args.nodes * args.gpus_per_node}"


def render(args) -> str:
    """The batch script for these arguments."""
    workdir = common.check_workdir(args.workdir, multi_host=False)
    overrides = []
    if mesh_name(args) != "none":
        preset = meshes.mesh_preset(mesh_name(args), fsdp=args.fsdp, tensor=args.tensor)
        expected = meshes.expected_device_count(mesh_name(args))
        if expected is not None and expected != args.nodes * args.gpus_per_node:
            raise ValueError(
                f"mesh preset {mesh_name(args)!r} needs {expected} devices, but the job has "
                f"{args.nodes} x {args.gpus_per_node} = {args.nodes * args.gpus_per_node} GPUs")
        overrides = meshes.config_overrides(preset)
    main_args = [f"--config={args.config}", f"--workdir={workdir}", *overrides, *args.extra]
    sbatch_lines = []
    for flag, value in (("partition", args.partition), ("account", args.account),
                        ("qos", args.qos)):
        if value:
            sbatch_lines.append(f"#SBATCH --{flag}={value}")
    sbatch_lines += [f"#SBATCH {flag}" for flag in args.sbatch_flag]
    env = common.parse_env(args.env)
    exports = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    fields = {
        "JOB_NAME": args.job_name, "NODES": str(args.nodes),
        "GPUS_PER_NODE": str(args.gpus_per_node), "CPUS_PER_TASK": str(args.cpus_per_task),
        "TIME": args.time, "LOG_DIR": shlex.quote(args.log_dir),
        "EXTRA_SBATCH": "\n".join(sbatch_lines), "CHDIR": shlex.quote(args.chdir),
        "MEM_FRACTION": args.mem_fraction, "EXPORTS": "\n".join(exports),
        "PYTHON": shlex.quote(args.python), "ARGS": " ".join(shlex.quote(a) for a in main_args),
    }
    text = TEMPLATE.read_text()
    for key, value in fields.items():
        # An empty multi-line field leaves no blank line behind.
        text = text.replace(f"@@{key}@@\n" if value == "" else f"@@{key}@@", value)
    if re.search(r"@@[A-Z_]+@@", text):
        raise ValueError(f"unfilled template field in {TEMPLATE}")
    return text


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        text = render(args)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    path = args.script_out or os.path.join(tempfile.gettempdir(), f"spt-{args.job_name}.sbatch")
    plan = common.Plan()
    # Slurm does not create the --output directory; a missing one fails the job silently.
    plan.add(["mkdir", "-p", args.log_dir])
    plan.add(script=f"cat > {shlex.quote(path)} <<'SPT_SBATCH_EOF'\n{text}SPT_SBATCH_EOF",
             note="the batch script")
    plan.add(["sbatch", path], note="submit")
    common.execute(plan, args.dry_run)


if __name__ == "__main__":
    main()
