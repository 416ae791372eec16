"""The repository as released: its top level is the design's, the metadata is written once
(version, dependencies), the license is Apache-2.0, the API reference pages name every public
name, the README stays short. Fast; the build itself (sdist, wheel, twine, installs) is
tests/test_wheel.py, the docs build tests/test_docs.py (both slow, run by .ci/run)."""

import ast
import os
import re
import subprocess
import sys
import tomllib

import pytest

import sptlib
from sptlib import config_paths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The design's top level, and the files that support it (CI, lint and test settings, the pinned
# versions, measured records, the release metadata).
CARD = {"setup.py", "README.md", "sptlib", "experiments", "launch", "tests", "docs"}
SUPPORT = {".ci", ".gitignore", "constraints.txt", "benchmarks", "pyproject.toml", "pytest.ini",
           "ruff.toml", "LICENSE", "CHANGELOG.md"}


def _read(*parts):
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as f:
        return f.read()


def test_top_level_is_the_design_cards():
    """What a fresh clone holds at its top level: the tracked files' first path components."""
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    top = {line.split("/", 1)[0] for line in out.splitlines() if line}
    assert top == CARD | SUPPORT, (sorted(top - CARD - SUPPORT), sorted(CARD | SUPPORT - top))
    # One home each: the package holds no second copy of the top-level folders.
    assert not [ln for ln in out.splitlines()
                if ln.startswith(("sptlib/experiments/", "sptlib/launch/"))]


def test_clone_maps_the_top_level_folders_from_any_folder(tmp_path):
    """A clone on the path (no install) imports `sptlib.experiments` / `sptlib.launch` from its
    top-level folders and resolves `--config=experiments/X.py` there, from another folder."""
    code = ("import sptlib.experiments as e, sptlib.launch.slurm as s, sptlib.config_paths as c;"
            "print(e.__file__); print(s.TEMPLATE); print(c.resolve_config('experiments/lra.py:x'))")
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        os.path.join(ROOT, "experiments", "__init__.py"),
        os.path.join(ROOT, "launch", "slurm.sbatch"),
        os.path.join(ROOT, "experiments", "lra.py") + ":x"]
    assert config_paths.EXPERIMENTS_DIR == os.path.join(ROOT, "experiments")


def test_version_is_written_once():
    project = tomllib.loads(_read("pyproject.toml"))
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "sptlib.__version__"}
    # setuptools reads the attribute without importing sptlib: it must be a literal.
    tree = ast.parse(_read("sptlib", "__init__.py"))
    literal = [n.value.value for n in tree.body if isinstance(n, ast.Assign)
               and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["__version__"]]
    assert literal == [sptlib.__version__]
    assert re.fullmatch(r"\d+\.\d+\.\d+", sptlib.__version__)
    assert "version" not in _read("setup.py").split("setup(", 1)[1]
    # The changelog's newest entry is this version.
    first = re.search(r"^## (\S+)", _read("CHANGELOG.md"), re.M).group(1)
    assert first == sptlib.__version__


def test_dependencies_are_listed_once():
    project = tomllib.loads(_read("pyproject.toml"))["project"]
    assert any(d.startswith("jax>=") for d in project["dependencies"])
    assert {"tpu", "cuda", "tfds", "gcs", "test", "docs", "dev"} <= set(project["optional-dependencies"])
    setup = _read("setup.py")
    for key in ("install_requires", "extras_require", "python_requires", "entry_points"):
        assert key not in setup, key


def test_license_is_apache_2():
    text = _read("LICENSE")
    assert "Apache License" in text.splitlines()[1] and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    project = tomllib.loads(_read("pyproject.toml"))["project"]
    assert project["license"] == {"file": "LICENSE"}
    assert "License :: OSI Approved :: Apache Software License" in project["classifiers"]
    assert os.path.isfile(os.path.join(ROOT, "sptlib", "py.typed"))


def _directives(page):
    """The objects a reference page documents (a bare `py:data` name is in `sptlib.api`, the
    module the page sets)."""
    names = re.findall(r"^\.\. (?:autofunction|autoclass|py:data):: (\S+)",
                       _read("docs", "reference", page), re.M)
    return [n if "." in n else f"sptlib.api.{n}" for n in names]


def test_api_reference_lists_every_public_name_with_its_docstring():
    from sptlib import api
    listed = _directives("api.md")
    assert sorted(listed) == sorted(f"sptlib.api.{n}" for n in api.__all__), listed
    assert len(listed) == len(set(listed))
    # MIXERS is data: its description is written on the page (a dict carries no docstring).
    undocumented = [n for n in api.__all__ if n != "MIXERS"
                    and not (getattr(api, n).__doc__ or "").strip()]
    assert not undocumented, undocumented


def test_mixer_reference_lists_every_registered_mixer():
    from sptlib.layers import MIXERS
    assert _directives("mixers.md") == [p.replace(":", ".") for p in MIXERS.values()]


def test_every_docs_page_is_in_the_table_of_contents():
    index = _read("docs", "index.md")
    entries = set(re.findall(r"^([\w/]+)$", index, re.M))
    pages = {os.path.relpath(os.path.join(d, f), os.path.join(ROOT, "docs"))[:-3]
             for d, _, files in os.walk(os.path.join(ROOT, "docs"))
             if "_build" not in d for f in files if f.endswith(".md") and f != "index.md"}
    assert pages == entries, (sorted(pages - entries), sorted(entries - pages))


def test_readme_is_short():
    assert len(_read("README.md").splitlines()) <= 100


@pytest.mark.parametrize("extra", ["docs", "test"])
def test_extras_are_pinned_in_the_constraints(extra):
    """CI installs with constraints.txt: what an extra adds is pinned there (the release tools
    and the docs builder included), so CI tests one package set."""
    project = tomllib.loads(_read("pyproject.toml"))["project"]
    pins = {re.split(r"==", ln)[0].lower().replace("_", "-")
            for ln in _read("constraints.txt").splitlines() if "==" in ln}
    for req in project["optional-dependencies"][extra]:
        name = re.split(r"[<>=\[ ;]", req, maxsplit=1)[0].lower().replace("_", "-")
        assert name in pins, (extra, name)
