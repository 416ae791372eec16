"""docs/your_data.md, executed: its toy-data snippets, its user mixer and its three commands per
example run as real subprocesses in a fresh folder, the commands exactly as written with the
tiny sizes the doc names appended to the config argument.

The whole document (two comparison grids: a Parquet token task and a .npy float task with the
user's mixer given by import path) is the slow test; the default suite runs every snippet and
the `--print_config` commands."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "your_data.md")
TINY = ",steps=2,pretrain_steps=2,d_model=16,n_layers=1,batch=8,eval_every=2"


def blocks():
    """[(language, text)] of the fenced blocks, in order."""
    text = open(DOC).read()
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w+)\n(.*?)```", text, re.S)]


def _env(tmp):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([ROOT, str(tmp)]))
    env.pop("XLA_FLAGS", None)
    return env


def _command(line, tmp):
    """A documented command as argv, run as written (`experiments/files.py` is the packaged
    config), with the tiny sizes appended to the config argument."""
    argv = shlex.split(line)
    out = []
    for a in argv:
        if a.startswith("--config=experiments/files.py:"):
            a += TINY
        out.append(a)
    return [sys.executable if out[0] == "python" else out[0]] + out[1:]


def run_doc(tmp, print_config_only):
    """Runs the doc's blocks in `tmp`; returns {first line of each command: stdout}."""
    outputs = {}
    for lang, text in blocks():
        if lang == "python":
            first, _, body = text.partition("\n")
            if first.startswith("# file: "):
                path = tmp / first[len("# file: "):].strip()
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(body)
                continue
            subprocess.run([sys.executable, "-c", text], cwd=tmp, env=_env(tmp), check=True,
                           timeout=120)
            continue
        for line in text.strip().splitlines():
            if print_config_only and "--print_config" not in line:
                continue
            p = subprocess.run(_command(line, tmp), cwd=tmp, env=_env(tmp), capture_output=True,
                               text=True, timeout=1200)
            assert p.returncode == 0, (line, p.stderr[-3000:])
            outputs[line] = p.stdout
    return outputs


def _check_print_config(outputs):
    configs = {k: json.loads(v) for k, v in outputs.items() if "--print_config" in k}
    assert len(configs) == 2
    (tokens,) = [v for k, v in configs.items() if "tokens.parquet" in k]
    (floats,) = [v for k, v in configs.items() if "features.npy" in k]
    # The inferred facts of the toy data: ids 0..15 (+ <pad>, <mask>), 2 classes, 20..59 long;
    # 32 steps x 3 channels.
    assert tokens[0]["task"]["vocab_size"] == 18 and tokens[0]["task"]["num_classes"] == 2
    assert tokens[0]["task"]["max_length"] <= 59
    assert floats[0]["task"]["input_type"] == "continuous" and floats[0]["task"]["d_input"] == 3
    assert floats[0]["task"]["max_length"] == 32


def test_your_data_snippets_and_print_config(tmp_path):
    _check_print_config(run_doc(tmp_path, print_config_only=True))


@pytest.mark.slow
def test_your_data_doc_end_to_end(tmp_path):
    outputs = run_doc(tmp_path, print_config_only=False)
    _check_print_config(outputs)
    tables = {k: v for k, v in outputs.items() if k.startswith("cat ")}
    tokens = tables["cat runs/tokens/comparison.md"]
    for model in ("transformer", "s4d"):
        for regime in ("scratch", "spt-masked"):
            assert re.search(rf"\| {model} \| {regime} \|", tokens), tokens
    floats = tables["cat runs/features/comparison.md"]
    for regime in ("scratch", "spt-masked"):
        assert re.search(rf"\| my_pkg.mixers:EMAMixer \| {regime} \|", floats), floats
    # Every run recorded the data it read.
    spec = json.loads((tmp_path / "runs/features/my_pkg.mixers:EMAMixer/spt-masked/seed0/"
                       "data_spec.json").read_text())
    assert spec["kind"] == "floats" and spec["channels"] == 3
