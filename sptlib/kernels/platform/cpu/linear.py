"""Small dense layers' weight gradient on XLA:CPU: `xᵀ g` by a C++ kernel (`weight_grad.cc`).

`weight_grad(x, g)` (x `[..., k]`, g `[..., n]` float32) -> `[k, n]` float32, the sum over all
leading positions; `sptlib.kernels.linear` lowers it for the CPU platform only.
"""

import jax
import jax.numpy as jnp

from sptlib.kernels.platform.cpu import build

_TARGET = "sptlib_weight_grad"


def _kernel(x2, g2):
    k, n = x2.shape[1], g2.shape[1]
    return (jax.ffi.ffi_call(_TARGET, jax.ShapeDtypeStruct((k, n), jnp.float32),
                             vmap_method="sequential")(x2, g2),)


# Tokens may be sharded (data parallel): each shard's partial xᵀ g is summed over their axis.
_op = build.partitioned(_kernel, (("m", "k"), ("m", "n")), (("k", "n"),), replicated=("k", "n"),
                        n_static=0, summed={0: "m"})


def weight_grad(x, g):
    """xᵀ g summed over the leading axes (see the module docstring)."""
    return _op(x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1]))[0]
