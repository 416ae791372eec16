"""The package is the product: `python -m build` makes an sdist and a wheel from this checkout
(the wheel built from the sdist, so the sdist is complete), `twine check` passes on both, the
wheel installed into a fresh virtualenv outside the checkout (with constraints.txt) runs the
README's commands from a folder that holds no sptlib file and its core install pulls no
TensorFlow, the sdist installed into another fresh virtualenv runs the smoke config, and an
editable install there maps `sptlib.experiments` to the checkout's top-level `experiments/`.

Slow (virtualenvs and real installs: docs/launching.md has the measured time); .ci/run runs it
as its own step. Nothing in the checkout is on the installed interpreter's path (no PYTHONPATH,
the commands run in an empty folder), so a file the wheel misses fails here.
"""

import glob
import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest

import sptlib

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONSTRAINTS = os.path.join(ROOT, "constraints.txt")
# Import names of TensorFlow and what only it (or clu's writers) needed.
TF_DISTS = ("tensorflow", "tensorflow-cpu", "tensorflow-datasets", "tensorboard", "clu", "keras")


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _run(cmd, cwd, timeout=900):
    t0 = time.time()
    out = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True,
                         timeout=timeout)
    print(f"[{time.time() - t0:.0f} s] {' '.join(map(str, cmd))[:160]}")
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


VERSION = sptlib.__version__


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """`python -m build`: the sdist, then the wheel built from it; both pass `twine check`."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), ROOT], cwd=str(out))
    sdist, wheel = str(out / f"sptlib-{VERSION}.tar.gz"), \
        str(out / f"sptlib-{VERSION}-py3-none-any.whl")
    assert sorted(glob.glob(str(out / "*"))) == sorted([sdist, wheel])
    checked = _run([sys.executable, "-m", "twine", "check", "--strict", sdist, wheel],
                   cwd=str(out)).stdout
    assert checked.count("PASSED") == 2, checked
    return sdist, wheel


@pytest.fixture(scope="module")
def wheel(dist):
    return dist[1]


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel):
    """A fresh virtualenv with the wheel (and libtpu, the `tpu` extra, for `sptlib.aot`)."""
    where = tmp_path_factory.mktemp("venv") / "venv"
    _run([sys.executable, "-m", "venv", str(where)], cwd=str(where.parent))
    python = str(where / "bin" / "python")
    t0 = time.time()
    _run([python, "-m", "pip", "install", "-q", "-c", CONSTRAINTS, f"{wheel}[tpu]"],
         cwd=str(where.parent), timeout=1800)
    print(f"install: {time.time() - t0:.0f} s")
    return python


def test_wheel_holds_the_kernels_sources_and_the_experiments(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for f in ("sptlib/kernels/platform/cpu/__init__.py", "sptlib/kernels/platform/cpu/build.py",
              "sptlib/kernels/platform/cpu/common.h", "sptlib/kernels/platform/cpu/fft_conv.cc",
              "sptlib/experiments/__init__.py", "sptlib/experiments/quickstart.py",
              "sptlib/experiments/lra.py", "sptlib/launch/slurm.sbatch", "sptlib/launch/tpu.py",
              "sptlib/py.typed"):
        assert f in names, f
    cc = {os.path.basename(f)
          for f in glob.glob(os.path.join(ROOT, "sptlib/kernels/platform/cpu/*.cc"))}
    assert cc <= {os.path.basename(n) for n in names}
    assert not [n for n in names if n.startswith(("experiments/", "tests/", "launch/"))]
    # The release metadata: the version read from sptlib.__version__, the license.
    meta = zipfile.ZipFile(wheel).read(f"sptlib-{VERSION}.dist-info/METADATA").decode()
    assert f"\nVersion: {VERSION}\n" in meta and "Apache Software License" in meta
    assert f"sptlib-{VERSION}.dist-info/licenses/LICENSE" in names


def test_sdist_holds_the_layout_and_installs_and_runs_the_smoke_config(dist, tmp_path):
    """The sdist (what PyPI users without a matching wheel build from) has the top-level
    experiments/ and launch/ and the release files; installed into a fresh virtualenv it runs the
    smoke config from an empty folder; an editable install of this checkout into the same
    virtualenv then finds the checkout's top-level experiments/ from any folder."""
    sdist = dist[0]
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for f in ("experiments/quickstart.py", "experiments/smoke.py", "launch/slurm.sbatch",
              "launch/tpu.py", "sptlib/py.typed", "sptlib/kernels/platform/cpu/fft_conv.cc",
              "LICENSE", "pyproject.toml", "setup.py", "README.md"):
        assert f in names, f
    where = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(where)], cwd=str(tmp_path))
    python = str(where / "bin" / "python")
    t0 = time.time()
    _run([python, "-m", "pip", "install", "-q", "-c", CONSTRAINTS, sdist], cwd=str(tmp_path),
         timeout=1800)
    print(f"sdist install: {time.time() - t0:.0f} s")
    work = tmp_path / "elsewhere"
    work.mkdir()
    _run([python, "-m", "sptlib.main", "--config=experiments/smoke.py", "--workdir=smoke",
          "--config.stages.pretrain.num_steps=2", "--config.stages.finetune.num_steps=2"],
         cwd=str(work))
    results = json.loads((work / "smoke" / "results.json").read_text())
    assert results["complete"] and results["stage_order"] == ["pretrain", "finetune"]
    code = ("import sptlib, sptlib.experiments as e, sptlib.launch as l; "
            "print(sptlib.__version__); print(e.__file__); print(l.__file__)")
    lines = _run([python, "-c", code], cwd=str(work)).stdout.splitlines()
    assert lines[0] == VERSION and all("site-packages" in x for x in lines[1:]), lines

    # Editable: the checkout's own folders, from any folder (the dependencies are there already).
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "-e", ROOT], cwd=str(tmp_path))
    lines = _run([python, "-c", code], cwd=str(work)).stdout.splitlines()
    assert lines[1:] == [os.path.join(ROOT, "experiments", "__init__.py"),
                         os.path.join(ROOT, "launch", "__init__.py")], lines
    out = _run([python, "-m", "sptlib.main", "--config=experiments/quickstart.py",
                "--print_config"], cwd=str(work))
    assert [s["stage"] for s in json.loads(out.stdout)] == ["pretrain", "finetune"]


def test_core_install_pulls_no_tensorflow(venv, wheel, tmp_path):
    """`pip install --dry-run --report` of the wheel (core) resolves no TensorFlow, TFDS,
    TensorBoard or clu, although the wheel declares TensorFlow (under the `tfds` extra, which a
    resolve of the extra would pull: the check can fail)."""
    report = tmp_path / "report.json"
    _run([venv, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
          "--report", str(report), "-c", CONSTRAINTS, wheel], cwd=str(tmp_path))
    core = {item["metadata"]["name"].lower().replace("_", "-")
            for item in json.loads(report.read_text())["install"]}
    assert {"jax", "flax", "tensorboardx", "sptlib"} <= core
    assert not core & set(TF_DISTS), sorted(core & set(TF_DISTS))
    meta = zipfile.ZipFile(wheel).read(f"sptlib-{VERSION}.dist-info/METADATA").decode()
    tf = [ln for ln in meta.splitlines() if ln.startswith("Requires-Dist: tensorflow")]
    assert all("; extra == " in ln for ln in tf), tf  # never unconditional
    assert sum('extra == "tfds"' in ln for ln in tf) == 2, tf  # tensorflow-cpu and -datasets


def test_installed_wheel_runs_the_commands_from_an_empty_folder(venv, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    # The installed package, not this checkout.
    where = _run([venv, "-c", "import sptlib; print(sptlib.__file__)"], cwd=str(work)).stdout
    assert "site-packages" in where and not where.startswith(ROOT)

    out = _run([venv, "-m", "sptlib.main", "--config=experiments/quickstart.py",
                "--print_config"], cwd=str(work))
    assert [s["stage"] for s in json.loads(out.stdout)] == ["pretrain", "finetune"]

    # A 2-step smoke training (generated ListOps, pretrain then finetune).
    _run([venv, "-m", "sptlib.main", "--config=experiments/smoke.py", "--workdir=smoke",
          "--config.stages.pretrain.num_steps=2", "--config.stages.finetune.num_steps=2"],
         cwd=str(work))
    results = json.loads((work / "smoke" / "results.json").read_text())
    assert results["complete"] and results["stage_order"] == ["pretrain", "finetune"]
    assert {k: v["final_step"] for k, v in results["stages"].items()} == \
        {"pretrain": 2, "finetune": 2}
    assert glob.glob(str(work / "smoke" / "finetune" / "events.out.tfevents.*"))

    # The public-API example (docs/api.md) on the installed package: an sptlib mixer in a Linen
    # and an NNX model, and the smoke run's SPT checkpoint loaded into both (it checks itself
    # against sptlib's own outputs and exits non-zero if they differ).
    out = _run([venv, os.path.join(ROOT, "docs", "examples", "public_api.py"),
                "--stage", str(work / "smoke" / "pretrain")], cwd=str(work))
    lines = out.stdout.strip().splitlines()
    assert lines[:2] == ["linen: (2, 3)", "nnx: (2, 3)"], lines
    assert lines[2].startswith("checkpoint -> linen: (2, 2)") and lines[3] == \
        "checkpoint -> nnx: (2, 2)", lines

    # A 2-run comparison (two seeds of one cell) and its table.
    _run([venv, "-m", "sptlib.compare", "--config=experiments/quickstart.py:steps=2,"
          "pretrain_steps=2", "--workdir=cmp", "--models=transformer", "--regimes=scratch",
          "--seeds=0,1", "--jobs=1"], cwd=str(work))
    table = (work / "cmp" / "comparison.md").read_text()
    assert "| transformer |" in table
    runs = json.loads((work / "cmp" / "comparison.json").read_text())
    assert sorted((r["seed"], r["status"], r["stages"]["scratch"]["steps"]) for r in runs) == \
        [(0, "finished", 2), (1, "finished", 2)]

    # One small stage compiled for a TPU slice (libtpu from the `tpu` extra; no TPU here).
    out = _run([venv, "-m", "sptlib.aot", "--config=experiments/smoke.py", "--topology=v4-8",
                "--stage=pretrain"], cwd=str(work))
    assert "smoke.py" in out.stdout and "pretrain" in out.stdout and "v4-8" in out.stdout

    # The launchers render their scripts from the package alone (--dry-run runs nothing).
    out = _run([venv, "-m", "sptlib.launch.slurm", "--nodes=1", "--gpus-per-node=2",
                "--config=experiments/lra.py:listops,s4,spt-masked", "--workdir=/shared/x",
                "--dry-run"], cwd=str(work))
    assert f"cd {work}" in out.stdout and "-m sptlib.main" in out.stdout
    out = _run([venv, "-m", "sptlib.launch.tpu", "setup", "--name=spt", "--zone=z",
                "--source=wheel", f"--wheel=sptlib-{VERSION}-py3-none-any.whl", "--dry-run"],
               cwd=str(work))
    assert "tpu-vm scp" in out.stdout

    # No TensorFlow came with the wheel, and a TFDS-only path says which extra to install.
    _run([venv, "-c", "import importlib.util as u; assert u.find_spec('tensorflow') is None"],
         cwd=str(work))
    bad = subprocess.run([venv, "-m", "sptlib.main", "--config=experiments/scifar.py:s4,scratch",
                          "--workdir=scifar"], cwd=str(work), env=_env(), capture_output=True,
                         text=True, timeout=600)
    lines = [ln for ln in bad.stderr.splitlines() if ln.startswith("sptlib.main: error")]
    assert bad.returncode == 2 and len(lines) == 1, bad.stderr[-2000:]
    assert "tfds extra" in lines[0] and "whl[tfds]" in lines[0]
