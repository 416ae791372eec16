"""Attention on GPUs: cuDNN flash attention, and a Pallas (Triton) flash kernel for the rest.

`kernel_for(q, causal=, window=)` returns the function `(q, k, v, key_mask) -> out` (the contract
of `sptlib.kernels.attention.dot_product_attention`: `[batch, length, heads, head_dim]`, q
pre-scaled, key_mask bool `[batch, length]`) that `sptlib.kernels.platform.attention` lowers for
CUDA, or None where the jnp reference (XLA) is the only choice:

- bf16 / fp16 inputs with a head size cuDNN takes (a multiple of 8, <= 128; <= 256 from Hopper
  on), full or causal, with or without a causal (left) window: `jax.nn.dot_product_attention(...,
  implementation="cudnn")`. Key padding: per-row key lengths when every row is padded at its end
  (every sptlib pipeline pads there; checked at run time), else the key mask itself, so any
  mask is exact. Scores and softmax statistics are float32 inside cuDNN.
- a bidirectional window (cuDNN takes no right-hand window without a causal mask), float32
  inputs and head sizes cuDNN refuses: `gpu_band.band_attention`, a Pallas (Triton) flash kernel
  that visits only the key blocks of the band (the whole sequence without a window).
- ROCm: None, with one warning (cuDNN is CUDA's; the Triton kernel is untested there).

A row that sees no real key (a padding query whose keys are all padding) is zero, with zero
gradient, in both kernels; the jnp reference gives it the mean of the values instead. Rows with
a real key agree with the reference.
"""

import functools
import warnings

import jax
import jax.numpy as jnp
from jax import lax

HALF = (jnp.bfloat16, jnp.float16)


def _max_head_dim():
    """128, or 256 on Hopper (compute capability 9.0) and later."""
    try:
        cc = float(getattr(jax.devices("gpu")[0], "compute_capability", "0") or 0)
    except RuntimeError:
        return 128
    return 256 if cc >= 9.0 else 128


@functools.lru_cache(maxsize=None)
def vendor():
    """``cuda`` | ``rocm`` for this process's GPUs ('' without one: traced for CUDA)."""
    try:
        client = jax.devices("gpu")[0].client
    except RuntimeError:
        return ""
    version = str(getattr(client, "platform_version", "")).lower()
    return "rocm" if "rocm" in version or "hip" in version else "cuda"


@functools.lru_cache(maxsize=None)
def _warn_rocm():
    warnings.warn("sptlib attention on ROCm: no fused kernel (cuDNN is CUDA-only and the Pallas "
                  "Triton kernel is untested on ROCm); using the jnp reference attention",
                  stacklevel=3)


def choice(dtype, head_dim, *, causal, window, gpu_vendor=None):
    """``cudnn`` | ``pallas`` | None (the jnp reference) for these arguments (module
    docstring); `gpu_vendor` overrides `vendor()`."""
    if (gpu_vendor if gpu_vendor is not None else vendor()) == "rocm":
        _warn_rocm()
        return None
    half = jnp.dtype(dtype) in HALF and head_dim % 8 == 0 and head_dim <= _max_head_dim()
    return "cudnn" if half and not (window and not causal) else "pallas"


def kernel_for(q, *, causal, window):
    """The fused function for these arguments, or None (see the module docstring)."""
    name = choice(q.dtype, q.shape[-1], causal=causal, window=window)
    if name == "pallas":
        from sptlib.kernels.platform import gpu_band  # deferred: imports Pallas

        band = int(window) if window else q.shape[1]  # no window: every key is in reach
        return lambda q, k, v, key_mask: gpu_band.band_attention(q, k, v, key_mask, band,
                                                                  bool(causal))
    if name == "cudnn":
        return functools.partial(cudnn_attention, causal=causal, window=window)
    return None


def _seen(key_mask, causal, window):
    """bool `[batch, length]`: rows with at least one real key they may attend to."""
    if not causal:  # full (a bidirectional window never reaches cuDNN)
        return jnp.broadcast_to(key_mask.any(axis=-1, keepdims=True), key_mask.shape)
    count = jnp.cumsum(key_mask.astype(jnp.int32), axis=-1)  # real keys j <= i
    if window:  # real keys in [i - window, i]
        count = count - jnp.pad(count, [(0, 0), (window + 1, 0)])[:, :key_mask.shape[1]]
    return count > 0


def cudnn_attention(q, k, v, key_mask, *, causal=False, window=0, implementation="cudnn"):
    """cuDNN flash attention (`implementation="xla"`: the same call through XLA, which is how
    the argument mapping is tested off GPU). Key padding as key lengths where every row is
    padded at its end, else as the mask; rows without a real key are 0 (module docstring)."""
    lengths = jnp.sum(key_mask, axis=-1, dtype=jnp.int32)
    at_end = jnp.all(key_mask == (jnp.arange(key_mask.shape[1]) < lengths[:, None]))
    call = functools.partial(jax.nn.dot_product_attention, scale=1.0, is_causal=bool(causal),
                             local_window_size=(int(window), 0) if window else None,
                             implementation=implementation)
    out = lax.cond(
        at_end,
        # A row of length 0 is zeroed below; length 1 keeps cuDNN's call defined.
        lambda: call(q, k, v, key_value_seq_lengths=jnp.maximum(lengths, 1)),
        lambda: call(q, k, v, mask=key_mask[:, None, None, :]))
    seen = _seen(key_mask, causal, window)[:, :, None, None]
    return jnp.where(seen, out, 0).astype(v.dtype)
