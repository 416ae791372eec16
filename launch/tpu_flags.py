"""The flags of the Cloud TPU launcher's sub-commands (`python -m sptlib.launch.tpu`)."""

from __future__ import annotations

import argparse

from sptlib.launch import common

MODES = ("spot", "reserved", "best-effort", "on-demand")
VENV = "~/spt-venv"
LOG_DIR = "~/spt-logs"


def _common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", required=True, help="queued resource id (and node id / prefix)")
    p.add_argument("--zone", required=True, help="e.g. us-central2-b (v4), us-west4-a (v5e)")
    p.add_argument("--project", default="", help="GCP project (default: gcloud's)")
    p.add_argument("--accelerator-type", default="", help="one slice, e.g. v4-32, v5litepod-16")
    p.add_argument("--num-slices", type=int, default=1, help="slices joined over DCN")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")


def _create_flags(p):
    p.add_argument("--mode", choices=MODES, default="spot")
    p.add_argument("--runtime-version", default="", help="default: by TPU generation")
    p.add_argument("--gcloud-flag", action="append", default=[],
                   help="extra flag for `queued-resources create`, e.g. --network=my-net")
    p.add_argument("--no-wait", dest="wait", action="store_false",
                   help="return once requested instead of waiting for ACTIVE")
    p.add_argument("--poll-seconds", type=int, default=30)


def _setup_flags(p):
    p.add_argument("--source", choices=("local", "git", "wheel"), default="local",
                   help="local: copy --source-dir (a checkout); git: fetch --git-url at "
                   "--git-ref; wheel: install --wheel (no checkout on the workers)")
    p.add_argument("--source-dir", default=".", help="checkout to copy (default: this folder)")
    p.add_argument("--wheel", default="", help="sptlib wheel for --source=wheel")
    p.add_argument("--git-url", default="")
    p.add_argument("--git-ref", default="", help="branch, tag or commit")
    p.add_argument("--python", default=common.PYTHON_VERSION)
    p.add_argument("--jax-version", default=common.JAX_VERSION)
    p.add_argument("--venv", default=VENV)
    p.add_argument("--gcsfuse-bucket", default="", help="mount this bucket on every worker")
    p.add_argument("--gcsfuse-mount", default="/mnt/gcs")


def _run_flags(p):
    p.add_argument("--config", required=True, help="experiment config, relative to the checkout")
    p.add_argument("--workdir", required=True, help="gs://BUCKET/PATH shared by all workers")
    p.add_argument("--run-name", default="", help="log file names (default: workdir basename)")
    p.add_argument("--mesh", default="", help="mesh preset (default: from the slice), or none")
    p.add_argument("--fsdp", type=int, default=1, help="fsdp share of each slice's devices")
    p.add_argument("--tensor", type=int, default=1, help="tensor share of each slice's devices")
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for every worker")
    p.add_argument("--foreground", action="store_true", help="stream output; dies with ssh")
    p.add_argument("--allow-local-workdir", action="store_true",
                   help="the workdir is a shared mount (gcsfuse / NFS), not gs://")
    p.add_argument("--log-dir", default=LOG_DIR)
    if not any(a.dest == "venv" for a in p._actions):
        p.add_argument("--venv", default=VENV)


def _log_flags(p):
    p.add_argument("--run-name", required=True)
    p.add_argument("--worker", default="0", help="worker index or 'all'")
    p.add_argument("--lines", type=int, default=100)
    p.add_argument("--follow", action="store_true", help="tail -F")
    p.add_argument("--collect", default="", help="copy every worker's log to this local dir")
    p.add_argument("--log-dir", default=LOG_DIR)


def build_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sptlib.launch.tpu", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    groups = {
        "create": [_create_flags], "delete": [], "status": [], "setup": [_setup_flags],
        "run": [_run_flags], "logs": [_log_flags], "up": [_create_flags, _setup_flags, _run_flags],
    }
    for name, adders in groups.items():
        p = sub.add_parser(name)
        _common_flags(p)
        for add in adders:
            add(p)
    p = sub.add_parser("stop")
    _common_flags(p)
    p.add_argument("--run-name", required=True)
    p.add_argument("--log-dir", default=LOG_DIR)
    return parser
