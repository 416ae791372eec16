"""`--help` and a bad flag of every command, in real subprocesses: the command's own flags are
listed, the exit status is 0 (help) or 2 (bad flag, one line), and JAX is never imported
(`python -X importtime` names every module the process imported)."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# command -> flags its --help must list (its own, not absl's)
COMMANDS = {
    "sptlib.main": ("--config", "--workdir", "--[no]verbose", "--[no]print_config"),
    "sptlib.compare": ("--config", "--workdir", "--jobs", "--shard", "--seeds", "--[no]verbose",
                       "--[no]report_only"),
    "sptlib.aot": ("--config", "--topology", "--[no]all", "--mfu", "--effort", "--jobs"),
    "sptlib.bench": ("--quick", "--only", "--lengths", "--accelerator-report", "--markdown"),
}
BAD_FLAG = {"sptlib.main": "--print_config=maybe", "sptlib.compare": "--jobs=x",
            "sptlib.aot": "--mfu=x", "sptlib.bench": "--repeats=x"}


def _run(module, *args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-X", "importtime", "-m", module, *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)


def _imported(stderr):
    """Module names from `-X importtime`'s lines (`import time: self | cumulative | name`)."""
    return {ln.split("|")[-1].strip() for ln in stderr.splitlines()
            if ln.startswith("import time:")}


def _our_lines(stderr):
    return [ln for ln in stderr.splitlines() if not ln.startswith("import time:")]


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_help_lists_own_flags_exits_0_without_jax(module):
    out = _run(module, "--help")
    assert out.returncode == 0, out.stderr[-2000:]
    for flag in COMMANDS[module]:
        assert flag in out.stdout, (flag, out.stdout)
    imported = _imported(out.stderr)
    assert "absl" in imported or module == "sptlib.bench"  # the importtime lines were read
    assert not {m for m in imported if m == "jax" or m.startswith(("jax.", "jaxlib"))}
    assert _our_lines(out.stderr) == []


@pytest.mark.parametrize("module", sorted(BAD_FLAG))
def test_bad_flag_is_one_line_exit_2_without_jax(module):
    out = _run(module, BAD_FLAG[module])
    assert out.returncode == 2, out.stderr[-2000:]
    (line,) = _our_lines(out.stderr)
    assert BAD_FLAG[module].split("=")[0].lstrip("-").replace("-", "_") in line.replace("-", "_")
    assert "jax" not in _imported(out.stderr)
    assert out.stdout == ""
