"""The documentation site: Sphinx with MyST over docs/*.md, the API reference from the docstrings.

Sphinx + MyST because flax, optax and orbax build theirs so (readthedocs, autodoc, Markdown
pages): a JAX user knows its cross-references and search. Build (the `docs` extra; CI runs it
with warnings as errors, `.ci/run`):

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Measured (2026-12-08, 2 cores shared with other jobs, load average ≈ 27, a fresh output folder):
the command above 75 s of wall time, 10 s of CPU; tests/test_docs.py (the same build and its
checks) 223 s of wall time, 13 s of CPU, at load ≈ 30. The CPU time is what an idle machine
waits for.

Warnings as errors check the internal links: a Markdown link to a page or heading that does not
exist, a page outside the table of contents, a docstring autodoc cannot render or import.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The checkout's sptlib, not an installed one (a clone builds its own docs).
sys.path.insert(0, ROOT)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import sptlib  # noqa: E402  (after the path)

project = "sptlib"
author = "sptlib authors"
copyright = "2026, sptlib authors"
release = version = sptlib.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# examples/ holds scripts (docs/api.md runs them), _build the output.
exclude_patterns = ["_build", "examples", "img"]

# Headings up to level 3 get anchors, so `[x](training.md#stages)` is checked like a page link.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
# The pages were written for GitHub's renderer first: fenced `text` / `bash` / `python` blocks
# only, so no lexer warnings; `<details>` and tables are plain Markdown there and here.

# sptlib's docstrings are Google style (Args:, Returns:) with `code` in single backticks.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
default_role = "code"
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# Flax Linen modules are dataclasses: their fields are the constructor's keyword arguments.
autodoc_default_options = {"show-inheritance": False}



def _plural_code(app, what, name, obj, options, lines):
    """`NamedSharding`s (a code name's plural, usual in the docstrings) is no valid reST: an
    interpreted text's end must not touch a letter. An escaped space joins them invisibly."""
    def join(m):
        after = m.string[m.end():m.end() + 1]
        return m.group(0) + ("\\ " if after.isalpha() else "")

    for i, line in enumerate(lines):
        # Pairs left to right (``literal`` pairs first), so an opening backtick never ends one.
        lines[i] = re.sub(r"``[^`]+``|`[^`]+`", join, line)


def setup(app):
    app.connect("autodoc-process-docstring", _plural_code)


html_theme = "alabaster"
html_title = f"sptlib {release}"
html_static_path = []
