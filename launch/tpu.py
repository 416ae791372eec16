"""Cloud TPU launcher: create a slice, set up every worker, run on all workers, logs, tear down.

    python -m sptlib.launch.tpu create --name=spt --zone=us-central2-b --accelerator-type=v4-32 --mode=spot
    python -m sptlib.launch.tpu setup  --name=spt --zone=us-central2-b
    python -m sptlib.launch.tpu run    --name=spt --zone=us-central2-b --accelerator-type=v4-32 \
        --config=experiments/lra.py:pathx,s4,spt-masked --workdir=gs://BUCKET/spt/pathx_s4
    python -m sptlib.launch.tpu logs   --name=spt --zone=us-central2-b --run-name=pathx_s4 --follow
    python -m sptlib.launch.tpu delete --name=spt --zone=us-central2-b
    python -m sptlib.launch.tpu up ...   # create (wait until ACTIVE) + setup + run, one command

Every sub-command takes `--dry-run`: it prints the exact commands (a bash script) and runs
nothing. Slices are TPU VMs requested through queued resources (`gcloud compute tpus
queued-resources`); multi-slice (`--num-slices=N`) creates nodes NAME-0 ... NAME-{N-1} joined over
DCN, whose MEGASCALE_* settings the queued resource provides. Arguments after `--` in `run` are
passed to `sptlib.main` (e.g. `-- --config.stages.finetune.num_steps=1000`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Sequence

from sptlib.launch import common
from sptlib.slices import meshes

from sptlib.launch.tpu_flags import build_parser

CHECKOUT = "~/sptlib"


# ---------------------------------------------------------------------------------------------
# gcloud command builders
# ---------------------------------------------------------------------------------------------
def _where(args) -> list[str]:
    flags = [f"--zone={args.zone}"]
    if args.project:
        flags.append(f"--project={args.project}")
    return flags


def node_names(name: str, num_slices: int) -> list[str]:
    """TPU VM node names: NAME for one slice; NAME-0 ... NAME-{n-1} for `--node-prefix=NAME`."""
    return [name] if num_slices == 1 else [f"{name}-{i}" for i in range(num_slices)]


def _accelerator(args) -> meshes.Accelerator | None:
    if not getattr(args, "accelerator_type", None):
        return None
    acc = meshes.parse_accelerator(args.accelerator_type)
    if acc.num_slices != 1:
        raise SystemExit("--accelerator-type is one slice (e.g. v4-32); use --num-slices for more")
    if acc.generation not in ("v2", "v3", "v4", "v5p", "v5e", "v6e"):
        raise SystemExit(f"--accelerator-type={args.accelerator_type} is not a TPU slice")
    return acc


def create_plan(args) -> common.Plan:
    acc = _accelerator(args)
    if acc is None:
        raise SystemExit("create needs --accelerator-type (e.g. v4-32)")
    runtime = args.runtime_version or acc.runtime_version
    alpha = args.mode == "best-effort"  # --best-effort exists only in the alpha track
    argv = ["gcloud"] + (["alpha"] if alpha else []) + [
        "compute", "tpus", "queued-resources", "create", args.name, *_where(args),
        f"--accelerator-type={acc.accelerator_type}", f"--runtime-version={runtime}"]
    if args.num_slices == 1:
        argv.append(f"--node-id={args.name}")
    else:
        argv += [f"--node-count={args.num_slices}", f"--node-prefix={args.name}"]
    argv += {"spot": ["--spot"], "reserved": ["--reserved"], "best-effort": ["--best-effort"],
             "on-demand": []}[args.mode]
    argv += args.gcloud_flag
    plan = common.Plan()
    plan.add(argv, note=f"request {args.num_slices} x {acc.accelerator_type} ({args.mode}); "
                        f"{meshes.summary(_preset_name(args))}")
    if args.wait:
        plan.extend(wait_plan(args))
    return plan


def wait_plan(args) -> common.Plan:
    """Polls the queued resource until ACTIVE (fails on FAILED / SUSPENDED)."""
    describe = shlex.join(["gcloud", "compute", "tpus", "queued-resources", "describe", args.name,
                           *_where(args), "--format=value(state.state)"])
    script = (f"while :; do s=$({describe}); echo \"{args.name}: $s\"; case \"$s\" in "
              "ACTIVE) break;; FAILED|SUSPENDED|SUSPENDING) exit 1;; esac; "
              f"sleep {args.poll_seconds}; done")
    plan = common.Plan()
    plan.add(script=script, note="wait until the slice is provisioned (state ACTIVE)")
    return plan


def delete_plan(args) -> common.Plan:
    plan = common.Plan()
    plan.add(["gcloud", "compute", "tpus", "queued-resources", "delete", args.name,
              *_where(args), "--force", "--quiet"],
             note="delete the queued resource and its TPU VMs (--force: even if running)")
    return plan


def status_plan(args) -> common.Plan:
    plan = common.Plan()
    plan.add(["gcloud", "compute", "tpus", "queued-resources", "describe", args.name,
              *_where(args)])
    return plan


def ssh_all(args, command: str, *, worker: str = "all", note: str = "") -> common.Plan:
    """`gcloud compute tpus tpu-vm ssh NODE --worker=... --command=...` on every node at once."""
    plan = common.Plan()
    nodes = node_names(args.name, args.num_slices)
    for i, node in enumerate(nodes):
        plan.add(["gcloud", "compute", "tpus", "tpu-vm", "ssh", node, *_where(args),
                  f"--worker={worker}", f"--command={command}"],
                 note=note if i == 0 else "", parallel=len(nodes) > 1)
    return plan


def scp_all(args, src: str, dest: str, *, note: str = "") -> common.Plan:
    """Copies a local file to every worker of every node (`tpu-vm scp --worker=all`)."""
    plan = common.Plan()
    nodes = node_names(args.name, args.num_slices)
    for i, node in enumerate(nodes):
        plan.add(["gcloud", "compute", "tpus", "tpu-vm", "scp", src, f"{node}:{dest}",
                  *_where(args), "--worker=all"],
                 note=note if i == 0 else "", parallel=len(nodes) > 1)
    return plan


# ---------------------------------------------------------------------------------------------
# setup
# ---------------------------------------------------------------------------------------------
def setup_script(args) -> str:
    """The bash script each worker runs: Python venv, pinned jax[tpu], sptlib, optional gcsfuse."""
    venv = common.remote_path(args.venv, "--venv")
    checkout = common.remote_path(CHECKOUT, "checkout")
    lines = ["set -euo pipefail"]
    if args.source == "wheel":
        package = common.remote_path(f"~/{_wheel_name(args)}", "--wheel") + "'[gcs]'"
    else:
        package = f"-e {checkout}'[gcs]'"
        if args.source == "local":
            lines.append(f"rm -rf {checkout} && mkdir -p {checkout} && "
                         f"tar -xzf ~/sptlib.tar.gz -C {checkout}")
        else:
            lines.append(f"rm -rf {checkout} && git init -q {checkout} && "
                         f"git -C {checkout} fetch -q --depth=1 {shlex.quote(args.git_url)} "
                         f"{shlex.quote(args.git_ref)} && git -C {checkout} checkout -q FETCH_HEAD")
    # uv provides Python 3.11 on images that ship an older one (Ubuntu 22.04 has 3.10). The
    # `gcs` extra (gcsfs) gives etils.epath its Cloud Storage backend for the gs:// workdir.
    lines += [
        "python3 -m pip install --user --quiet --upgrade uv",
        f"~/.local/bin/uv venv --quiet --allow-existing --python={args.python} {venv}",
        f"~/.local/bin/uv pip install --quiet --python={venv}/bin/python "
        f"{shlex.quote(f'jax[tpu]=={args.jax_version}')} {package}",
        f"{venv}/bin/python -c {shlex.quote('import jax, sptlib; print(jax.__version__)')}",
    ]
    if args.gcsfuse_bucket:
        mount = common.remote_path(args.gcsfuse_mount, "--gcsfuse-mount")
        bucket = shlex.quote(args.gcsfuse_bucket)
        lines += [
            "if ! command -v gcsfuse >/dev/null; then "
            "echo \"deb [signed-by=/usr/share/keyrings/cloud.google.asc] "
            "https://packages.cloud.google.com/apt gcsfuse-$(lsb_release -c -s) main\" "
            "| sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null; "
            "curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg "
            "| sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null; "
            "sudo apt-get update -q && sudo apt-get install -y -q gcsfuse; fi",
            f"sudo mkdir -p {mount} && sudo chown \"$USER\" {mount}",
            f"mountpoint -q {mount} || gcsfuse --implicit-dirs {bucket} {mount}",
        ]
    return "; ".join(lines)


def _wheel_name(args) -> str:
    return args.wheel.replace("\\", "/").rsplit("/", 1)[-1]


def setup_plan(args) -> common.Plan:
    plan = common.Plan()
    if args.source == "wheel":
        if not args.wheel.endswith(".whl"):
            raise SystemExit("--source=wheel needs --wheel=PATH.whl (pip wheel --no-deps .)")
        plan.extend(scp_all(args, args.wheel, _wheel_name(args),
                            note="copy the wheel to every worker"))
    elif args.source == "local":
        src = str(args.source_dir)
        tarball = f"/tmp/sptlib-{args.name}.tar.gz"
        # Tracked and untracked-but-not-ignored files: the working tree as the user sees it.
        plan.add(script=(f"git -C {shlex.quote(src)} ls-files -z --cached --others "
                         f"--exclude-standard | tar -C {shlex.quote(src)} -czf "
                         f"{shlex.quote(tarball)} --ignore-failed-read --null -T -"),
                 note=f"pack the local checkout {src}")
        plan.extend(scp_all(args, tarball, "sptlib.tar.gz", note="copy it to every worker"))
    elif not (args.git_url and args.git_ref):
        raise SystemExit("--source=git needs --git-url and --git-ref")
    plan.extend(ssh_all(args, setup_script(args),
                        note=f"on every worker: venv {args.venv}, jax[tpu]=={args.jax_version}, "
                             "sptlib" + (", gcsfuse" if args.gcsfuse_bucket else "")))
    return plan


# ---------------------------------------------------------------------------------------------
# run / logs / stop
# ---------------------------------------------------------------------------------------------
def _preset_name(args) -> str:
    acc = _accelerator(args)
    prefix = f"{args.num_slices}x" if args.num_slices > 1 else ""
    return f"{prefix}{acc.name}" if acc else "cpu"


def run_env(args) -> dict[str, str]:
    """Environment for every worker's process.

    Multi-host initialisation itself needs nothing here: on Cloud TPU VMs
    `jax.distributed.initialize()` reads the worker list and this worker's index from the
    VM metadata, and for multi-slice the queued resource publishes MEGASCALE_COORDINATOR_ADDRESS,
    MEGASCALE_NUM_SLICES and MEGASCALE_SLICE_ID there. JAX_PLATFORMS=tpu,cpu turns a TPU that
    failed to initialise (e.g. held by a stale process) into an error instead of a silent run
    on the host CPU. SPTLIB_DISTRIBUTED=1 makes sptlib call `jax.distributed.initialize()`, since
    nothing in a TPU VM's environment says the job spans several hosts.
    """
    env = {"JAX_PLATFORMS": "tpu,cpu", "TF_CPP_MIN_LOG_LEVEL": "1", "SPTLIB_DISTRIBUTED": "1",
           "SPT_RUN_NAME": args.run_name}
    env.update(common.parse_env(args.env))
    return env


def run_overrides(args) -> list[str]:
    overrides = []
    mesh = args.mesh or (_preset_name(args) if args.accelerator_type else "")
    if mesh and mesh != "none":
        preset = meshes.mesh_preset(mesh, fsdp=args.fsdp, tensor=args.tensor)
        overrides += meshes.config_overrides(preset)
    return overrides + list(args.extra)


def run_script(args) -> str:
    """What each worker runs: the experiment in the background (detached), or in the foreground."""
    workdir = common.check_workdir(args.workdir, multi_host=True,
                                   allow_local=args.allow_local_workdir)
    venv = common.remote_path(args.venv, "--venv")
    logs = common.remote_path(args.log_dir, "--log-dir")
    run = args.run_name
    cmd = common.experiment_command(f"{venv}/bin/python", args.config, workdir,
                                    run_overrides(args), run_env(args))
    log = f"{logs}/{run}.$(hostname).log"
    pid = f"{logs}/{run}.pid"
    # The checkout (absent with --source=wheel: the packaged experiments/ need none) is where a
    # relative --config of the user's own resolves.
    lines = ["set -euo pipefail", f"mkdir -p {logs} {CHECKOUT}", f"cd {CHECKOUT}"]
    if args.foreground:
        lines.append(f"{cmd} 2>&1 | tee {log}")
        return "; ".join(lines)
    upload = ""
    if workdir.startswith("gs://"):
        # Keep each worker's log next to the checkpoints once the run ends (also after a crash).
        upload = (f"; gcloud storage cp {log} {shlex.quote(workdir + '/logs/')} "
                  ">/dev/null 2>&1 || true")
    inner = f"{cmd} > {log} 2>&1; rc=$?{upload}; exit $rc"
    lines += [
        f"if [ -f {pid} ] && kill -0 $(cat {pid}) 2>/dev/null; then "
        f"echo \"{run} is already running on $(hostname)\"; exit 1; fi",
        # setsid + nohup: the job outlives the ssh session; the pid is its process group.
        f"setsid nohup bash -c {shlex.quote(inner)} > /dev/null 2>&1 < /dev/null & "
        f"echo $! > {pid}",
        f"echo \"started {run} on $(hostname): log {log}\"",
    ]
    return "; ".join(lines)


def run_plan(args) -> common.Plan:
    return ssh_all(args, run_script(args),
                   note=f"start {args.config} on every worker, workdir {args.workdir}")


def logs_plan(args) -> common.Plan:
    logs = common.remote_path(args.log_dir, "--log-dir")
    pattern = f"{logs}/{args.run_name}.*.log"
    if args.collect:
        # scp paths are relative to the remote home; `~` is not expanded by every scp mode.
        remote = pattern[2:] if pattern.startswith("~/") else pattern
        plan = common.Plan()
        plan.add(["mkdir", "-p", args.collect])
        for i, node in enumerate(node_names(args.name, args.num_slices)):
            plan.add(["gcloud", "compute", "tpus", "tpu-vm", "scp", f"{node}:{remote}",
                      args.collect, *_where(args), "--worker=all"],
                     note="copy every worker's log here" if i == 0 else "")
        return plan
    tail = f"tail -n {args.lines} {'-F ' if args.follow else ''}{pattern}"
    return ssh_all(args, tail, worker=args.worker,
                   note=f"worker {args.worker} logs (process 0 writes the metrics)")


def stop_plan(args) -> common.Plan:
    pid = f"{common.remote_path(args.log_dir, '--log-dir')}/{args.run_name}.pid"
    return ssh_all(args, f"if [ -f {pid} ]; then kill -- -$(cat {pid}) 2>/dev/null || true; "
                         f"rm -f {pid}; fi",
                   note=f"stop {args.run_name} on every worker (its process group)")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    extra = []
    if "--" in argv:  # everything after `--` goes to sptlib.main
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
        # sptlib.main has no --dry-run: one typed after `--` still means "print, run nothing".
        if "--dry-run" in extra:
            extra.remove("--dry-run")
            argv.append("--dry-run")
    args = build_parser(__doc__).parse_args(argv)
    args.extra = extra
    if args.num_slices < 1:
        raise SystemExit("--num-slices must be >= 1")
    if hasattr(args, "workdir") and not args.run_name:
        args.run_name = args.workdir.rstrip("/").rsplit("/", 1)[-1] or "run"
    return args


def make_plan(args) -> common.Plan:
    builders = {"create": create_plan, "delete": delete_plan, "status": status_plan,
                "setup": setup_plan, "run": run_plan, "logs": logs_plan, "stop": stop_plan}
    if args.cmd == "up":
        plan = create_plan(args)
        plan.extend(setup_plan(args))
        plan.extend(run_plan(args))
        return plan
    return builders[args.cmd](args)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        plan = make_plan(args)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    common.execute(plan, args.dry_run)


if __name__ == "__main__":
    main()
