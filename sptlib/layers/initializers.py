"""Every initialiser of the Linen layers: dense projections by scheme, and the SSM parameters.

Dense projections (`config.model.init_scheme`):

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

SSM parameters: the structured matrices come from `sptlib.kernels` (`s4d_init` and `nplr_legs`,
pure NumPy); the initialisers below turn them and the random draws into Linen initialisers.
Complex values are stored as real arrays with a trailing (re, im) axis of size 2.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

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


def boxed(init, names):
    """`init` with logical axis names (`nn.with_logical_partitioning`), one per dimension."""
    return nn.with_logical_partitioning(init, names)


# ----------------------------------------------------------------------------------------------
# SSM parameters


def const(value):
    """Initialiser returning a fixed (NumPy) value."""
    def init(key, shape, dtype=jnp.float32):
        del key
        v = jnp.asarray(value, dtype)
        assert v.shape == tuple(shape), (v.shape, shape)
        return v
    return init


def log_uniform(low, high):
    """log of values drawn log-uniformly from [low, high] (e.g. log dt in [1e-3, 1e-1])."""
    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, np.log(low), np.log(high))
    return init


def real_pair(z):
    """Complex array `[...]` -> real `[..., 2]` (re, im)."""
    z = np.asarray(z)
    return np.stack([z.real, z.imag], axis=-1)


def complex_normal(std):
    """(re, im) pairs of a complex normal with E|z|^2 = std^2."""
    def init(key, shape, dtype=jnp.float32):
        return jax.random.normal(key, shape, dtype) * (std / np.sqrt(2.0))
    return init


def negated_exp(init):
    """`-exp(init(...))`: turns a log-parameterised draw into the value itself, negated."""
    def wrapped(key, shape, dtype=jnp.float32):
        return -jnp.exp(init(key, shape, dtype))
    return wrapped


def random_diagonal_inits(modes):
    """The unstructured control of the structured-vs-random ablation (`init_kind='random'`):
    initialisers of log(-Re A), Im A and B ((re, im) pairs), drawn from the parameter's key.

    -Re A uniform in [0.1, 1) (stable), Im A uniform in [0, pi * modes) — the span S4D-Lin
    covers, but unsorted and unevenly spaced — and B complex normal with E|B|^2 = 1.
    """
    def a_re(key, shape, dtype=jnp.float32):
        return jnp.log(jax.random.uniform(key, shape, dtype, 0.1, 1.0))

    def a_im(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, 0.0, np.pi * modes)

    return a_re, a_im, complex_normal(1.0)


def uniform(low, high):
    """Initializer drawing uniformly from [low, high) (e.g. DLR's angles theta in [0, 2 pi))."""
    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, low, high)
    return init


def sqrt_log_uniform(low, high):
    """a with a^2 drawn log-uniformly from [low, high] (DLR: |lambda| = exp(-a^2))."""
    def init(key, shape, dtype=jnp.float32):
        return jnp.sqrt(jnp.exp(log_uniform(low, high)(key, shape, dtype)))
    return init


def normal_over_modes(modes):
    """(re, im) pairs, each normal with variance 1/(2 modes), so E|C|^2 = 1/modes: the modes of
    a GSS kernel add up rather than average."""
    def init(key, shape, dtype=jnp.float32):
        return jax.random.normal(key, shape, dtype) / np.sqrt(2.0 * modes)
    return init


def s5_eigenbasis(v, channels, state):
    """S5's (B, C) initialisers: B = V^* B0 `[P/2, H, 2]`, C = C0 V `[n_dir, H, P/2, 2]` with B0
    lecun-normal and C0 normal / sqrt(P), V `[P, P/2]` the eigenvectors of HiPPO-LegS's normal
    part (P = `state`, H = `channels`)."""
    vh = jnp.asarray(v.conj().T, jnp.complex64)  # [P/2, P]
    v = jnp.asarray(v, jnp.complex64)

    def b_init(key, shape, dtype=jnp.float32):
        b = vh @ nn.initializers.lecun_normal()(key, (state, channels), jnp.float32)
        return jnp.stack([b.real, b.imag], axis=-1).astype(dtype)

    def c_init(key, shape, dtype=jnp.float32):
        c = (jax.random.normal(key, (shape[0], channels, state)) / np.sqrt(state)) @ v
        return jnp.stack([c.real, c.imag], axis=-1).astype(dtype)

    return b_init, c_init
