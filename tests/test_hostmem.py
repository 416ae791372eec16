"""sptlib.hostmem: asked to (SPTLIB_HUGEPAGES=1), the command-line programs re-execute themselves
with glibc's malloc asking for transparent huge pages, once, with the same command line, and not
where it cannot apply."""

import os
import subprocess
import sys

import pytest

from sptlib import hostmem

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ON = {"SPTLIB_HUGEPAGES": "1"}
APPLIES = hostmem.huge_pages_env(ON) is not None


def test_env_adds_the_tunable_once_and_keeps_others():
    assert hostmem.huge_pages_env({}) is None  # off unless asked for
    assert hostmem.huge_pages_env({"SPTLIB_HUGEPAGES": "0"}) is None
    if not APPLIES:
        return
    env = hostmem.huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "A": "1", **ON})
    assert env == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", "A": "1",
                   **ON}
    assert hostmem.huge_pages_env(ON)["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    # Set already (by the user or by the re-executed process itself): nothing to do.
    assert hostmem.huge_pages_env(env) is None
    assert hostmem.huge_pages_env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0", **ON}) is None


@pytest.mark.parametrize("on", [True, False])
def test_reexecutes_once_with_the_same_command_line(on):
    # A real process and a real execve: the probe prints what it sees, then asks for huge pages;
    # the re-executed probe prints again (now with the tunable) and asks again, a no-op.
    probe = ("import os, sys; print('TUNABLES=' + os.environ.get('GLIBC_TUNABLES', ''), "
             "'ARGV=' + ' '.join(sys.argv[1:]), flush=True); "
             "from sptlib import hostmem; hostmem.reexec_with_huge_pages(); print('DONE')")
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "SPTLIB_HUGEPAGES")}
    if on:
        env.update(ON)
    out = subprocess.run([sys.executable, "-c", probe, "x", "--y=1"], capture_output=True,
                         text=True, timeout=60, cwd=REPO, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    expected = ["TUNABLES= ARGV=x --y=1"]
    if APPLIES and on:
        expected.append("TUNABLES=glibc.malloc.hugetlb=1 ARGV=x --y=1")
    assert out.stdout.splitlines() == expected + ["DONE"]
