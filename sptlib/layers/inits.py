"""Initialisation schemes of the dense projections (`config.model.init_scheme`).

- ``linen`` (default): fan-in scaled truncated normal kernels (`lecun_normal`), zero biases.
- ``torch``: PyTorch's defaults, as in `nn.Linear` and `nn.TransformerEncoderLayer`: kernels and
  biases uniform in ±1/sqrt(fan_in) (kaiming-uniform with a = √5); the attention's query, key and
  value kernels xavier-uniform over the stacked `[d_model, 3 · heads · head_dim]` in-projection,
  their biases and the output projection's bias zero.

The two differ in scale (torch's kernels have about 1/√3 of Linen's standard deviation, its
xavier in-projection about 0.7×) and torch's non-zero biases. On generated 16 × 16 gratings
(L = 256) a masked-SPT'd 2 × 64 Transformer finetuned for 600 steps reached ~51% from a Linen
draw and ~91% from a torch draw with otherwise identical training (docs/reproducing.md, "SPT
fidelity vs a PyTorch peer").
"""

import math

import jax
import jax.numpy as jnp
import flax.linen as nn

SCHEMES = ("linen", "torch")


def check(scheme):
    if scheme not in SCHEMES:
        raise ValueError(f"model.init_scheme={scheme!r} not in {SCHEMES}")


def symmetric_uniform(bound):
    """Initializer drawing uniformly from [-bound, bound]."""
    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)
    return init


def dense(scheme, fan_in, **axes):
    """`(kernel_init, bias_init)` of a dense layer with `fan_in` input features.

    `axes` (`in_axis`, `out_axis`) locate the fan-in axes of multi-axis kernels (Linen scheme).
    """
    check(scheme)
    if scheme == "torch":
        bound = 1.0 / math.sqrt(fan_in)
        return symmetric_uniform(bound), symmetric_uniform(bound)
    kernel = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", **axes)
    return kernel, nn.initializers.zeros


def attention_in(scheme, d_model, inner):
    """Kernel init of the query/key/value projections `[d_model, heads, head_dim]`
    (`inner` = heads · head_dim); their biases are zero in both schemes."""
    check(scheme)
    if scheme == "torch":
        return symmetric_uniform(math.sqrt(6.0 / (d_model + 3 * inner)))
    return nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=0,
                                            out_axis=(1, 2))
