"""Shared pieces of the launchers: a plan of shell commands that is either printed or run.

Every launcher builds a `Plan` first and then either prints it (`--dry-run`: a bash script that
does exactly what the launcher would do, nothing is executed) or runs it step by step.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys
from typing import Sequence

# Must match the jax pin in setup.py (tests/test_launch.py checks this).
JAX_VERSION = "0.10.2"
PYTHON_VERSION = "3.11"

# Remote paths are written into remote shell scripts unquoted so that `~` expands there;
# only these characters are accepted in them.
_SAFE_REMOTE_PATH = re.compile(r"^[~A-Za-z0-9_./-]+$")


def remote_path(path: str, what: str) -> str:
    """Validates a path used unquoted in a remote shell script (so `~` expands remotely)."""
    if not _SAFE_REMOTE_PATH.match(path):
        raise ValueError(f"{what} {path!r}: use only letters, digits, '~', '_', '.', '/', '-'")
    return path


@dataclasses.dataclass
class Step:
    """One command: `argv` (run without a shell) or `script` (run with `bash -c`)."""

    argv: list[str] | None = None
    script: str | None = None
    note: str = ""          # printed as a `# ...` comment above the command
    parallel: bool = False  # consecutive parallel steps run at once, then wait for all

    def render(self) -> str:
        return shlex.join(self.argv) if self.argv is not None else self.script


@dataclasses.dataclass
class Plan:
    steps: list[Step] = dataclasses.field(default_factory=list)

    def add(self, argv: Sequence[str] | None = None, *, script: str | None = None,
            note: str = "", parallel: bool = False) -> None:
        self.steps.append(Step(list(argv) if argv is not None else None, script, note, parallel))

    def extend(self, other: "Plan") -> None:
        self.steps.extend(other.steps)

    def render(self) -> str:
        """The plan as a bash script (what `--dry-run` prints)."""
        lines = ["set -euo pipefail"]
        i = 0
        while i < len(self.steps):
            group = self._group(i)
            for step in group:
                if step.note:
                    lines.append(f"# {step.note}")
                lines.append(step.render() + (" &" if len(group) > 1 else ""))
            if len(group) > 1:
                lines.append("wait")
            i += len(group)
        return "\n".join(lines) + "\n"

    def _group(self, i: int) -> list[Step]:
        if not self.steps[i].parallel:
            return [self.steps[i]]
        j = i
        while j < len(self.steps) and self.steps[j].parallel:
            j += 1
        return self.steps[i:j]

    def run(self) -> None:
        """Runs the steps in order (parallel groups at once); stops at the first failure."""
        i = 0
        while i < len(self.steps):
            group = self._group(i)
            procs = []
            for step in group:
                print(f"+ {step.render()}", file=sys.stderr, flush=True)
                cmd = step.argv if step.argv is not None else ["bash", "-c", step.script]
                procs.append(subprocess.Popen(cmd))
            codes = [p.wait() for p in procs]
            if any(codes):
                bad = [s.render() for s, c in zip(group, codes) if c]
                raise SystemExit(f"command failed (exit {max(codes)}): {bad[0]}")
            i += len(group)


def execute(plan: Plan, dry_run: bool) -> None:
    if dry_run:
        sys.stdout.write(plan.render())
    else:
        plan.run()


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """`["K=V", ...]` -> dict, checking the names are valid shell variable names."""
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise ValueError(f"--env expects NAME=VALUE, got {pair!r}")
        env[key] = value
    return env


def experiment_command(python: str, config: str, workdir: str, overrides: Sequence[str],
                       env: dict[str, str]) -> str:
    """`env K=V ... PYTHON -m sptlib.main --config=... --workdir=... overrides` (shell text).

    `python` is a remote path (unquoted so `~` expands); everything else is quoted.
    """
    parts = []
    if env:
        parts.append("env")
        parts += [shlex.quote(f"{k}={v}") for k, v in env.items()]
    parts += [python, "-m", "sptlib.main", shlex.quote(f"--config={config}"),
              shlex.quote(f"--workdir={workdir}")]
    parts += [shlex.quote(o) for o in overrides]
    return " ".join(parts)


def check_workdir(workdir: str, *, multi_host: bool, allow_local: bool = False) -> str:
    """Multi-host jobs need one shared workdir: a `gs://` bucket path (or a shared mount).

    Each TPU VM worker has its own disk, so a local path would give every process its own,
    divergent checkpoints; refuse it unless `allow_local` says the path is a shared mount
    (e.g. gcsfuse or NFS).
    """
    if workdir.startswith("gs://"):
        if not re.match(r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/.*)?$", workdir):
            raise ValueError(f"workdir {workdir!r} is not a valid gs://bucket/path")
        return workdir.rstrip("/")
    if multi_host and not allow_local:
        raise ValueError(
            f"workdir {workdir!r} is not on gs://: every worker would write its own copy. Use "
            "gs://BUCKET/PATH, or pass --allow-local-workdir for a shared mount (gcsfuse, NFS)")
    return workdir
