"""Attention on NVIDIA GPUs: cuDNN flash attention, and banded blocks for bidirectional windows.

`kernel_for(q, causal=, window=)` returns the function `(q, k, v, key_mask) -> out` (the contract
of `sptlib.kernels.attention.dot_product_attention`: `[batch, length, heads, head_dim]`, q
pre-scaled, key_mask bool `[batch, length]`) that `sptlib.kernels.platform.attention` lowers for
CUDA, or None where the jnp reference (XLA) is the better or only choice:

- bf16 / fp16 inputs with a head size cuDNN takes (a multiple of 8, <= 128; <= 256 from Hopper
  on), full or causal, with or without a causal (left) window: `jax.nn.dot_product_attention(...,
  implementation="cudnn")`. Key padding is passed as per-row key lengths (the number of real
  keys), which is exact for padding at the end of each row: every sptlib pipeline pads there.
  Scores and softmax statistics are float32 inside cuDNN.
- a bidirectional window (cuDNN takes no right-hand window without a causal mask):
  `banded_attention`, below, in any dtype.
- float32 inputs: None (cuDNN's flash kernels are half-precision only; XLA's fp32 attention).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

MASK_VALUE = -1e30
HALF = (jnp.bfloat16, jnp.float16)


def _max_head_dim():
    """128, or 256 on Hopper (compute capability 9.0) and later."""
    try:
        cc = float(getattr(jax.devices("gpu")[0], "compute_capability", "0") or 0)
    except RuntimeError:
        return 128
    return 256 if cc >= 9.0 else 128


def choice(dtype, head_dim, *, causal, window):
    """``cudnn`` | ``banded`` | None (the jnp reference) for these arguments (module docstring)."""
    if window and not causal:
        return "banded"
    if jnp.dtype(dtype) not in HALF or head_dim % 8 or head_dim > _max_head_dim():
        return None
    return "cudnn"


def kernel_for(q, *, causal, window):
    """The fused function for these arguments, or None (see the module docstring)."""
    name = choice(q.dtype, q.shape[-1], causal=causal, window=window)
    if name == "banded":
        return functools.partial(banded_attention, window=window)
    if name == "cudnn":
        return functools.partial(cudnn_attention, causal=causal, window=window)
    return None


def cudnn_attention(q, k, v, key_mask, *, causal=False, window=0, implementation="cudnn"):
    """cuDNN flash attention with key padding as key lengths (`implementation="xla"`: the same
    call through XLA, which is how the argument mapping is tested off GPU)."""
    lengths = jnp.sum(key_mask, axis=-1, dtype=jnp.int32)
    out = jax.nn.dot_product_attention(
        q, k, v, scale=1.0, is_causal=bool(causal), key_value_seq_lengths=lengths,
        local_window_size=(int(window), 0) if window else None, implementation=implementation)
    return out.astype(v.dtype)


def banded_attention(q, k, v, key_mask, *, window, block=512, causal=False):
    """Softmax attention restricted to `|i - j| <= window` by whole-sequence block products.

    The sequence is cut into blocks of `block` positions; a query block meets the key blocks
    at offsets `-r..r` (`r = ceil(window / block)`; `-r..0` when causal). One scan step per
    offset multiplies *every* query block with its shifted key block at once (one large
    batched matmul, tensor-core shaped), folding the scores into an online softmax; the body
    is rematerialised, so memory is O(length · block) per head, not O(length · window). Equal to
    `dot_product_attention(..., window=window)` up to float rounding.

    Args:
      q, k, v: `[batch, length, heads, head_dim]` (q pre-scaled); key_mask bool
        `[batch, length]`.
      window: band half-width (> 0). block: positions per block. causal: keys j <= i only.
    Returns:
      `[batch, length, heads, head_dim]` in v's dtype.
    """
    batch, length, heads, head_dim = q.shape
    c = max(1, min(block, length))
    n = -(-length // c)
    pad = n * c - length
    reach = -(-window // c)
    offsets = jnp.arange(-reach, 1 if causal else reach + 1)
    # Blocks as [batch, heads, n, c, head_dim]; keys padded by `reach` masked blocks each side,
    # so the shifted views never wrap.
    blocks = lambda a, extra: jnp.pad(a, [(0, 0), (extra * c, pad + extra * c), (0, 0), (0, 0)]
                                      ).reshape(batch, -1, c, heads, head_dim
                                                ).transpose(0, 3, 1, 2, 4)
    qb = blocks(q, 0)
    kb, vb = blocks(k, reach), blocks(v, reach)
    mb = jnp.pad(key_mask, [(0, 0), (reach * c, pad + reach * c)]).reshape(batch, -1, c)
    pos = jnp.arange(c)

    @jax.checkpoint
    def step(carry, offset):
        acc, m, l = carry
        start = reach + offset  # key block index (in the padded blocks) of query block 0
        k_o = lax.dynamic_slice_in_dim(kb, start, n, axis=2)
        v_o = lax.dynamic_slice_in_dim(vb, start, n, axis=2)
        m_o = lax.dynamic_slice_in_dim(mb, start, n, axis=1)  # [batch, n, c]
        s = jnp.einsum("bhnqd,bhnkd->bhnqk", qb, k_o, preferred_element_type=jnp.float32)
        diff = pos[:, None] - (pos[None, :] + offset * c)  # query - key position
        allowed = (diff <= window) & ((diff >= 0) if causal else (diff >= -window))
        allowed = allowed[None, None] & m_o[:, None, :, None, :]
        s = jnp.where(allowed, s, MASK_VALUE)  # [batch, heads, n, c, c]
        m_new = jnp.maximum(m, s.max(axis=-1))
        corr = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[..., None])
        l = l * corr + p.sum(axis=-1)
        acc = acc * corr[..., None] + jnp.einsum("bhnqk,bhnkd->bhnqd", p.astype(v.dtype), v_o,
                                                 preferred_element_type=jnp.float32)
        return (acc, m_new, l), None

    init = (jnp.zeros(qb.shape, jnp.float32),
            jnp.full(qb.shape[:-1], MASK_VALUE, jnp.float32),
            jnp.zeros(qb.shape[:-1], jnp.float32))
    (acc, _, l), _ = lax.scan(step, init, offsets)
    # Every query sees itself only if its own key is real; a row without any real key in its
    # band gets the uniform average of masked scores, as the reference (l > 0 always: the
    # maximum contributes exp(0) = 1).
    out = (acc / l[..., None]).astype(v.dtype)
    out = out.transpose(0, 2, 3, 1, 4).reshape(batch, n * c, heads, head_dim)
    return out[:, :length]
