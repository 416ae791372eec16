"""Host memory: glibc's malloc told to keep freed memory for reuse (the command-line default on
machines without an accelerator).

Why. XLA:CPU allocates every buffer of a step afresh (one temp buffer per call: 66 MiB for the
S4D block's forward+backward at L = 1k, batch 8, H 256, N 64; 0.96 GiB at 16k), and glibc
serves allocations above 32 MiB with a new `mmap` that it returns to the kernel when freed. So
each step faults all its memory in again, 4 KiB at a time, and unmaps it (with TLB shootdowns
across the cores): measured on the 2-core CPU machine, ~20k page faults per 8,192 tokens and
37-72 ms of system time per 8,192 tokens at every length, about half of the S4D block's time.
How much depends on the call rate and on the machine's state, so the S4D scaling exponent from
1k to 16k read anything from 0.97 to 1.12 over runs of the same code. Keeping freed memory in
the heap (no per-buffer mmap, no trimming) removes the faults after the first step: the same
block ran at 39.0 / 41.3 / 42.1 ms per 8,192 tokens at 1k / 4k / 16k (system time ~0, exponent
~1.03), against 98 / 68 / 65 ms with glibc's defaults in the same hour.

How. glibc reads its tunables (`GLIBC_TUNABLES`) once, when a process starts, so the
command-line programs (`sptlib.main`, `sptlib.protocol.compare`, `sptlib.bench`) call
`reexec_with_malloc_tunables()` first, which re-executes the same command line with these
added, before anything heavy is imported:

- `SPTLIB_MALLOC=retain`: `glibc.malloc.mmap_max=0` (large blocks come from the heap, not from
  fresh mappings), `glibc.malloc.trim_threshold=1 TiB` (freed memory is not given back),
  `glibc.malloc.arena_max=1` (one heap for all threads: a thread's own arena would still map
  blocks above 64 MiB afresh). The process' resident memory then stays at its peak, as with any
  framework's caching allocator.
- `SPTLIB_MALLOC=system`: glibc's defaults.
- `SPTLIB_MALLOC=auto` (the default): `retain` where the computation runs on the CPU, `system`
  where `JAX_PLATFORMS` puts another platform first or, without it, where the machine has an
  accelerator device (`/dev/accel<n>`: TPU; `/dev/vfio/<n>`: TPU v5+; `/dev/nvidia<n>`). There the step's buffers
  live on the device, and one malloc arena for all threads would only serialise the input
  pipeline's threads (a TPU host has hundreds of cores).
- `SPTLIB_HUGEPAGES=1` (either mode): also `glibc.malloc.hugetlb=1` (glibc >= 2.35: malloc asks
  for transparent huge pages), where transparent huge pages are not set to `never`.

A tunable the user has put in `GLIBC_TUNABLES` keeps the user's value. Nothing happens where the
switch cannot apply (not Linux/glibc >= 2.26) or where every tunable is set already, e.g. in the
re-executed process and in `sptlib.protocol.compare`'s workers, which inherit it.

It changes the whole process' malloc: in `sptlib.bench --peer torch` the PyTorch reference blocks
run in the same process with the same allocator (they gain more than sptlib: their large
temporaries were page-fault-bound too). Library users who call sptlib from their own programs get
the same effect by starting Python with the tunables above in `GLIBC_TUNABLES`.
"""

import glob
import os
import sys

MODES = ("auto", "retain", "system")
RETAIN = (("glibc.malloc.mmap_max", "0"), ("glibc.malloc.trim_threshold", str(1 << 40)),
          ("glibc.malloc.arena_max", "1"))
HUGE_PAGES = (("glibc.malloc.hugetlb", "1"),)
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


def accelerator_present():
    """True where this machine has a TPU or NVIDIA GPU device node."""
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*")
                or glob.glob("/dev/nvidia[0-9]*"))


def _runs_on_cpu(environ):
    platforms = [p.strip().lower() for p in environ.get("JAX_PLATFORMS", "").split(",")
                 if p.strip()]
    if platforms:
        return platforms[0] == "cpu"
    return not accelerator_present()


def wanted_tunables(environ=None):
    """[(tunable, value)] that `SPTLIB_MALLOC` / `SPTLIB_HUGEPAGES` ask for here (see the module
    docstring); raises ValueError naming the variable for an unknown mode."""
    environ = os.environ if environ is None else environ
    mode = environ.get("SPTLIB_MALLOC", "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"SPTLIB_MALLOC={environ['SPTLIB_MALLOC']!r}: expected one of "
                         f"{', '.join(MODES)}")
    if mode == "auto":
        mode = "retain" if _runs_on_cpu(environ) else "system"
    glibc = _glibc_version() or (0, 0)
    if not sys.platform.startswith("linux") or glibc < (2, 26):
        return []
    out = list(RETAIN) if mode == "retain" else []
    if environ.get("SPTLIB_HUGEPAGES", "0") == "1" and glibc >= (2, 35) and _thp_enabled():
        out += HUGE_PAGES
    return out


def malloc_env(environ=None):
    """The environment to re-execute with, or None where nothing is to be added (nothing asked
    for, not applicable here, or every asked-for tunable set already, by the user or by an
    earlier re-execution). Raises ValueError for a bad `SPTLIB_MALLOC`."""
    environ = os.environ if environ is None else environ
    tunables = environ.get("GLIBC_TUNABLES", "")
    present = {t.split("=", 1)[0].strip() for t in tunables.split(":") if t.strip()}
    missing = [f"{k}={v}" for k, v in wanted_tunables(environ) if k not in present]
    if not missing:
        return None
    return dict(environ, GLIBC_TUNABLES=":".join([t for t in (tunables,) if t] + missing))


def reexec_with_malloc_tunables():
    """Replaces this process by the same command line with the malloc tunables added (see the
    module docstring); returns only where there is nothing to add. Call it first in a
    `__main__`. A bad `SPTLIB_MALLOC` exits with status 2 and one line saying so."""
    try:
        env = malloc_env()
    except ValueError as e:
        print(f"sptlib: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, sys.orig_argv, env)
