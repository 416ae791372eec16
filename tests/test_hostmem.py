"""sptlib.kernels.platform.cpu.hostmem: the command-line programs re-execute themselves once, with the same command line,
with glibc's malloc told to keep freed memory (SPTLIB_MALLOC=retain; the default `auto` where JAX
runs on the CPU) and, asked to, to use huge pages (SPTLIB_HUGEPAGES=1); the user's own tunables
win; and the retained memory is real: a second large allocation takes no page faults."""

import os
import subprocess
import sys

import pytest

from sptlib.kernels.platform.cpu import hostmem

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APPLIES = bool(hostmem.wanted_tunables({"SPTLIB_MALLOC": "retain"}))
CPU = {"JAX_PLATFORMS": "cpu"}
RETAIN = ("glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776:"
          "glibc.malloc.arena_max=1")
HUGE = bool(hostmem.wanted_tunables({"SPTLIB_MALLOC": "system", "SPTLIB_HUGEPAGES": "1"}))
needs_glibc = pytest.mark.skipif(not APPLIES, reason="not Linux with glibc >= 2.26")


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("GLIBC_TUNABLES", "SPTLIB_MALLOC", "SPTLIB_HUGEPAGES")}
    env.update(extra)
    return env


@needs_glibc
def test_env_adds_the_retain_tunables_once_and_keeps_the_users():
    assert hostmem.malloc_env(CPU)["GLIBC_TUNABLES"] == RETAIN  # the default on CPU
    assert hostmem.malloc_env({"SPTLIB_MALLOC": "system", **CPU}) is None
    env = hostmem.malloc_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4", "A": "1", **CPU})
    # The user's arena_max stays; the other two are added after it.
    assert env == {"A": "1", **CPU, "GLIBC_TUNABLES": "glibc.malloc.arena_max=4:"
                   "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776"}
    assert hostmem.malloc_env(env) is None  # set already: the re-executed process does nothing
    if HUGE:
        both = hostmem.malloc_env({"SPTLIB_HUGEPAGES": "1", **CPU})["GLIBC_TUNABLES"]
        assert both == RETAIN + ":glibc.malloc.hugetlb=1"
        only = hostmem.malloc_env({"SPTLIB_HUGEPAGES": "1", "SPTLIB_MALLOC": "system"})
        assert only["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"


@needs_glibc
@pytest.mark.parametrize("platforms,accelerator,retains", [
    ("cpu", True, True), ("tpu", False, False), ("cuda,cpu", False, False),
    (None, False, True), (None, True, False)])
def test_auto_retains_only_where_jax_runs_on_the_cpu(monkeypatch, platforms, accelerator,
                                                     retains):
    monkeypatch.setattr(hostmem, "accelerator_present", lambda: accelerator)
    environ = {} if platforms is None else {"JAX_PLATFORMS": platforms}
    assert bool(hostmem.malloc_env(environ)) == retains
    assert bool(hostmem.malloc_env({"SPTLIB_MALLOC": "auto", **environ})) == retains
    # An explicit mode holds on any machine.
    assert hostmem.malloc_env({"SPTLIB_MALLOC": "retain", **environ})["GLIBC_TUNABLES"] == RETAIN
    assert hostmem.malloc_env({"SPTLIB_MALLOC": "system", **environ}) is None


def test_unknown_mode_names_the_variable():
    with pytest.raises(ValueError, match="SPTLIB_MALLOC='keep'.*auto, retain, system"):
        hostmem.wanted_tunables({"SPTLIB_MALLOC": "keep"})
    out = subprocess.run([sys.executable, "-c", "from sptlib.kernels.platform.cpu import "
                          "hostmem; hostmem.reexec_with_malloc_tunables()"],
                         capture_output=True, text=True,
                         timeout=60, cwd=REPO, env=_clean_env(SPTLIB_MALLOC="keep"))
    assert out.returncode == 2 and "SPTLIB_MALLOC='keep'" in out.stderr, out.stderr


@pytest.mark.parametrize("mode", ["retain", "system"])
def test_reexecutes_once_with_the_same_command_line(mode):
    # A real process and a real execve: the probe prints what it sees, then asks for the
    # tunables; the re-executed probe prints again (now with them) and asks again, a no-op.
    probe = ("import os, sys; print('TUNABLES=' + os.environ.get('GLIBC_TUNABLES', ''), "
             "'ARGV=' + ' '.join(sys.argv[1:]), flush=True); "
             "from sptlib.kernels.platform.cpu import hostmem; "
             "hostmem.reexec_with_malloc_tunables(); print('DONE')")
    out = subprocess.run([sys.executable, "-c", probe, "x", "--y=1"], capture_output=True,
                         text=True, timeout=60, cwd=REPO, env=_clean_env(SPTLIB_MALLOC=mode))
    assert out.returncode == 0, out.stderr[-2000:]
    expected = ["TUNABLES= ARGV=x --y=1"]
    if APPLIES and mode == "retain":
        expected.append(f"TUNABLES={RETAIN} ARGV=x --y=1")
    assert out.stdout.splitlines() == expected + ["DONE"]


# Allocates, touches and frees 256 MiB twice (from a second thread too, as XLA's pool does) and
# prints the minor page faults the second round took (the kernel's count, getrusage).
_FAULTS = """
import ctypes, resource, threading
from sptlib.kernels.platform.cpu import hostmem
hostmem.reexec_with_malloc_tunables()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 256 << 20
def round_trip():
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)
    libc.free(p)
def in_thread():
    t = threading.Thread(target=round_trip)
    t.start()
    t.join()
round_trip()
in_thread()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
round_trip()
in_thread()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@needs_glibc
@pytest.mark.parametrize("mode", ["retain", "system"])
def test_retained_memory_takes_no_page_faults_the_second_time(mode):
    out = subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True,
                         timeout=60, cwd=REPO, env=_clean_env(SPTLIB_MALLOC=mode))
    assert out.returncode == 0, out.stderr[-2000:]
    faults = int(out.stdout.split()[-1])
    huge_pages = 2 * (256 << 20) // (2 << 20)  # two rounds of 256 MiB in 2 MiB pages
    if mode == "retain":
        assert faults < huge_pages // 2, faults
    else:  # fresh mappings each time: every page faults again (65,536 per round in 4 KiB
        # pages; at least one per 2 MiB where transparent huge pages serve them)
        assert faults >= huge_pages, faults
