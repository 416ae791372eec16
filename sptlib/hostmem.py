"""Host memory: glibc's malloc asked for transparent huge pages (opt-in, `SPTLIB_HUGEPAGES=1`).

Why. XLA:CPU allocates every buffer of a step afresh, and glibc serves allocations above 32 MiB
with a new `mmap`, returned to the kernel when freed. At long lengths most buffers are that
large (one `[8, 16384, 512]` float32 activation is 256 MiB), so each step faults in all of them
again, 4 KiB at a time. With huge pages it is 2 MiB at a time. Measured on the 2-core CPU
machine (`[8 * L, 256] @ [256, 512]` float32, ms per 8,192 tokens): 5.0 at L = 1k, 12.8 at 16k
with 4 KiB pages, 6.5 at 16k with huge pages; the S4D block's forward+backward at 16k
(batch 8, H 256, N 64) ran at 88-117k tokens/s without, 148-162k with (separate runs; the S4D
scaling exponent from 1k to 16k 1.00 with, 1.04-1.05 without).

How. The switch is glibc's tunable `glibc.malloc.hugetlb=1` (glibc >= 2.35: malloc calls
`madvise(MADV_HUGEPAGE)` on the memory it maps). Tunables are read once, when the process
starts, so with `SPTLIB_HUGEPAGES=1` sptlib's command-line programs call
`reexec_with_huge_pages()` first, which re-executes the same command line with the tunable added
to `GLIBC_TUNABLES`, before anything heavy is imported. It does nothing without that variable,
where the switch cannot apply (not Linux/glibc >= 2.35, transparent huge pages set to `never`)
or where it is set already (setting `GLIBC_TUNABLES` yourself needs no re-execution).

Why opt-in: it changes the whole process' malloc, other libraries' included. PyTorch in
`sptlib.bench --peer torch` gains more from it than sptlib where it materialises large tensors
(the reference S4 block's Cauchy fallback ran 2.9x faster at L = 1k), so the side-by-side
acceptance run compares both libraries with the default 4 KiB pages.
"""

import os
import sys

TUNABLE = "glibc.malloc.hugetlb"
THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def _glibc_version():
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        return tuple(int(p) for p in version.split(".")[:2]) if name == "glibc" else None
    except (AttributeError, ValueError, OSError):
        return None


def _thp_enabled():
    try:
        with open(THP_MODE) as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def huge_pages_env(environ=None):
    """The environment to re-execute with, or None unless asked for (`SPTLIB_HUGEPAGES=1`), when
    the switch is set already or cannot apply here."""
    environ = os.environ if environ is None else environ
    tunables = environ.get("GLIBC_TUNABLES", "")
    if (environ.get("SPTLIB_HUGEPAGES", "0") != "1" or TUNABLE in tunables
            or not sys.platform.startswith("linux") or (_glibc_version() or (0, 0)) < (2, 35)
            or not _thp_enabled()):
        return None
    return dict(environ, GLIBC_TUNABLES=":".join(t for t in (tunables, f"{TUNABLE}=1") if t))


def reexec_with_huge_pages():
    """Replaces this process by the same command line with huge pages switched on (see the
    module docstring); returns only where that does not apply. Call it first in a `__main__`."""
    env = huge_pages_env()
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, sys.orig_argv, env)
