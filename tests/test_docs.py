"""The documentation site builds with warnings as errors (a broken internal link, a page outside
the table of contents, a docstring autodoc cannot import or render fails it), and its API
reference lists every name of `sptlib.api` with its docstring and every registered mixer.

Slow (Sphinx reads all of docs/ and imports sptlib: docs/conf.py has the measured time); needs
the `docs` extra; .ci/run runs it as its own step.
"""

import html
import os
import re
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("html")
    t0 = time.time()
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(out / ".doctrees"), os.path.join(ROOT, "docs"), str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "JAX_PLATFORMS": "cpu"})
    print(f"[{time.time() - t0:.0f} s] sphinx -W --keep-going -b html docs")
    assert build.returncode == 0, build.stderr[-4000:]
    assert not build.stderr.strip(), build.stderr[-4000:]
    return out


def _text(page):
    with open(page, encoding="utf-8") as f:
        return html.unescape(re.sub(r"<[^>]+>", "", f.read()))


def test_api_reference_has_every_public_name_with_its_docstring(site):
    from sptlib import api
    page = site / "reference" / "api.html"
    raw = page.read_text(encoding="utf-8")
    # Letters and digits only: rendering turns backticks into code and "x" into smart quotes.
    text = re.sub(r"\W", "", _text(page))
    for name in api.__all__:
        assert f'id="sptlib.api.{name}"' in raw, name
        if name != "MIXERS":
            # The docstring's first sentence, as rendered.
            summary = getattr(api, name).__doc__.strip().split("\n\n")[0].split(". ")[0]
            first = re.sub(r"\W", "", summary)[:60]
            assert first in text, (name, first)


def test_mixer_reference_has_every_registered_mixer(site):
    from sptlib.layers import MIXERS, get_mixer
    raw = (site / "reference" / "mixers.html").read_text(encoding="utf-8")
    for name, path in MIXERS.items():
        anchor = path.replace(":", ".")
        assert f'id="{anchor}"' in raw, anchor
        assert f'id="{anchor}.__call__"' in raw, anchor
        if hasattr(get_mixer(name), "step"):  # the recurrent ones (Hyena has no step)
            assert f'id="{anchor}.step"' in raw, anchor


def test_every_guide_is_a_page(site):
    for page in ("quickstart", "api", "models", "training", "reproducing", "your_data"):
        assert (site / f"{page}.html").is_file(), page
