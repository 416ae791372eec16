"""Dense-layer products, with the platform's CPU kernel for the weight gradient on XLA:CPU.

`matmul(x, w)` (`x: [..., k]`, `w: [k, n]` -> `[..., n]`) and `project(x, w, n_in)` (x's last
`n_in` axes contracted with w's first, e.g. attention's `[d] x [d, heads, head_dim]`) equal
`jnp.matmul` / `jnp.tensordot` in value and in every gradient. The forward and the input gradient
are XLA's dots. On CPU, for float32 and small weights (`n % 8 == 0`, `k * n <= 2**13`), the
weight gradient `xᵀ g` over all leading positions is the platform's CPU kernel
(`sptlib.kernels.platform`). Inside a train step XLA:CPU
copies a transpose of x or g for such a product and then runs a dot whose small output splits
poorly across threads: on the 2-core test machine the quickstart-size Transformer's train step
(d_model 64, FFN 128, 8,192 tokens) ran 1.09-1.12x faster with the kernel (interleaved A/B in one
process, 21 rounds), though alone the two products take about the same time. Elsewhere (other backends, `sptlib.protocol.aot`'s TPU programs,
other shapes or dtypes, no compiler) the jnp products run, in their original layout.

`dot_general` has `jax.lax.dot_general`'s signature, so it can be passed to `flax.linen.Dense`
(`nn.Dense(..., dot_general=linear.dot_general)`; parameters unchanged).
"""

import math

import jax
import jax.numpy as jnp

from sptlib.kernels import platform

# k * n up to 64 x 128. Measured alone (8,192 tokens, 2 cores) the CPU kernel beat XLA's dot up
# to about this size and lost from 128 x 128 on (its partial sums leave L1).
MAX_WEIGHT = 2 ** 13

def _weight_grad(x, g):
    """xᵀ g summed over the leading axes: x `[..., k]`, g `[..., n]` -> `[k, n]` float32."""
    lead = tuple(range(x.ndim - 1))

    def jnp_wg(x, g):
        return jnp.tensordot(x, g, axes=(lead, lead), preferred_element_type=jnp.float32)

    return platform.on_platforms(jnp_wg, x, g.astype(jnp.float32),
                                 cpu=platform.cpu_weight_grad)


@jax.custom_vjp
def _matmul_cpu_wgrad(x, w):
    return jnp.matmul(x, w)


def _fwd(x, w):
    return jnp.matmul(x, w), (x, w)


def _bwd(res, g):
    x, w = res
    return jnp.matmul(g, w.T).astype(x.dtype), _weight_grad(x, g).astype(w.dtype)


_matmul_cpu_wgrad.defvjp(_fwd, _bwd)


def _cpu_kernel_ok(x, k, n):
    return (x.dtype == jnp.float32 and x.ndim >= 2 and n % 8 == 0 and k * n <= MAX_WEIGHT
            and platform.cpu_kernels())


def matmul(x, w):
    """`x [..., k] @ w [k, n] -> [..., n]`, with the CPU kernel's weight gradient on CPU (module doc)."""
    if w.ndim == 2 and w.dtype == jnp.float32 and _cpu_kernel_ok(x, *w.shape):
        return _matmul_cpu_wgrad(x, w)
    return jnp.matmul(x, w)


def project(x, w, n_in=1):
    """x's last `n_in` axes contracted with w's first `n_in`: `[..., *w.shape[:n_in]]` ->
    `[..., *w.shape[n_in:]]` (`jnp.tensordot(x, w, n_in)`). On CPU, where `matmul` takes the
    CPU weight gradient, it runs as one 2-D product; elsewhere as the tensordot itself, so
    sharded weights keep their layout."""
    k, n = math.prod(w.shape[:n_in]), math.prod(w.shape[n_in:])
    lead = x.shape[:x.ndim - n_in]

    def general(x, w):
        return jnp.tensordot(x, w, n_in)

    if w.dtype != jnp.float32 or not _cpu_kernel_ok(x, k, n):
        return general(x, w)

    def cpu(x, w):
        y = _matmul_cpu_wgrad(x.reshape(*lead, k), w.reshape(k, n))
        return y.reshape(*lead, *w.shape[n_in:])

    return platform.on_platforms(general, x, w, cpu=cpu)


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                **kwargs):
    """`jax.lax.dot_general`, through `matmul` for a dense layer's contraction (lhs's last axis
    with rhs `[k, n]`'s first, no batch axes, default precision)."""
    (lc, rc), (lb, rb) = dimension_numbers
    dense = (tuple(lc) == (lhs.ndim - 1,) and tuple(rc) == (0,) and not lb and not rb
             and rhs.ndim == 2 and precision is None and not kwargs
             and preferred_element_type in (None, lhs.dtype))
    if dense and rhs.dtype == jnp.float32 and _cpu_kernel_ok(lhs, *rhs.shape):
        return _matmul_cpu_wgrad(lhs, rhs)
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type, **kwargs)
