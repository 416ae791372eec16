"""Checks around the steps that keep a broken state off the disk and a full disk off the run.

- `finite` / `finite_params`: whether a metric / every floating parameter is finite (one
  reduction, run when a checkpoint is about to be saved, never in the train step).
- `check_space`: the stage folder's file system has room for a checkpoint and the file-size
  limit (ulimit -f) allows one, before the first step.
"""

import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np

from sptlib.errors import WriteError


def finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


@jax.jit
def _all_finite(params):
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(params)
              if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def finite_params(params) -> bool:
    """Whether every floating parameter is finite (replicated scalar: same on every process)."""
    out = _all_finite(params)
    return bool(np.asarray(out.addressable_data(0)))


def state_bytes(state) -> int:
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)
                   if hasattr(x, "dtype")))


def check_space(stage_dir, state) -> None:
    """Room for one more checkpoint of `state` in `stage_dir`'s file system, and a file-size
    limit that allows it; raises a one-line `WriteError` naming the folder otherwise.

    A checkpoint's largest files are its arrays (up to the whole state in one OCDBT file) and
    orbax's `_METADATA` (measured: 1.3 KiB per array); both are bounded from above here."""
    text = str(stage_dir)
    if "://" in text:
        return
    leaves = [x for x in jax.tree.leaves(state) if hasattr(x, "dtype")]
    need = max(state_bytes(state), 1536 * len(leaves) + (64 << 10))
    probe = text
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        free = shutil.disk_usage(probe or ".").free
    except OSError:
        return
    if free < need + (16 << 20):
        raise WriteError(f"cannot write {stage_dir}: {free / 2**20:.1f} MiB free there, a "
                         f"checkpoint of this stage needs about {need / 2**20:.1f} MiB (+16 MiB "
                         f"for logs and results); free some space or use another --workdir")
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return
    if soft != resource.RLIM_INFINITY and soft < need:
        raise WriteError(f"cannot write {stage_dir}: the file-size limit is {soft} bytes "
                         f"(ulimit -f), a checkpoint of this stage needs files of up to about "
                         f"{need} bytes; raise the limit (ulimit -f unlimited)")
