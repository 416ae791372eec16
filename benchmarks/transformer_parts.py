"""Where the quickstart-size Transformer step loses to PyTorch on XLA:CPU: its parts, side by side.

    python benchmarks/transformer_parts.py [part ...]      # needs torch (pip install torch==2.13.0)

Each part of one 2 x 64 pre-norm layer at the quickstart size (batch 32, L 256, 4 heads of 16,
FFN 128, fp32) is timed forward + backward (gradients of the sum for every input), JAX jitted
against PyTorch eager, interleaved (JAX, torch, JAX, torch, ...; 15 rounds after 2 warm-ups),
medians in ms. The attention core is timed in JAX three ways (sptlib's plain kernel, its
chunked kernel with one chunk covering L, `jax.nn.dot_product_attention`) and in torch two ways
(the same matmul-softmax-matmul, and `scaled_dot_product_attention`, the fused CPU kernel that
`nn.TransformerEncoder` uses). Results: the history of docs/performance_notes.md (git show ded39a6:docs/performance_notes.md).
"""

import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sptlib.kernels import attention as ka  # noqa: E402

B, L, H, DH, D, F = 32, 256, 4, 16, 64, 128


def jax_fb(f, *xs):
    g = jax.jit(jax.grad(lambda *a: f(*a).sum(), argnums=tuple(range(len(xs)))))
    xs = [jnp.asarray(x) for x in xs]
    return lambda: jax.block_until_ready(g(*xs))


def torch_fb(f, *xs):
    ts = [torch.tensor(x, requires_grad=True) for x in xs]

    def run():
        for t in ts:
            t.grad = None
        f(*ts).sum().backward()
    return run


def medians(fns, rounds=15):
    for f in fns.values():
        f()
        f()
    ts = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t)
    return {k: 1e3 * statistics.median(v) for k, v in ts.items()}


def cases():
    rng = np.random.default_rng(0)
    qkv = [rng.standard_normal((B, L, H, DH)).astype(np.float32) for _ in range(3)]
    to_bhld = [a.transpose(0, 2, 1, 3).copy() for a in qkv]
    x = rng.standard_normal((B, L, D)).astype(np.float32)
    w = (0.1 * rng.standard_normal((D, F))).astype(np.float32)
    h = rng.standard_normal((B, L, F)).astype(np.float32)
    s = rng.standard_normal((B, H, L, L)).astype(np.float32)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return {
        "attention core (sptlib plain) vs torch SDPA": (
            lambda q, k, v: ka.dot_product_attention(q, k, v), qkv,
            lambda q, k, v: sdpa(q, k, v, scale=1.0), to_bhld),
        "attention core (sptlib chunked, one chunk) vs torch SDPA": (
            lambda q, k, v: ka.chunked_attention(q, k, v, chunk_size=L), qkv,
            lambda q, k, v: sdpa(q, k, v, scale=1.0), to_bhld),
        "attention core (jax.nn.dot_product_attention) vs torch SDPA": (
            lambda q, k, v: jax.nn.dot_product_attention(q, k, v, scale=1.0), qkv,
            lambda q, k, v: sdpa(q, k, v, scale=1.0), to_bhld),
        "attention core, both matmul-softmax-matmul": (
            lambda q, k, v: ka.dot_product_attention(q, k, v), qkv,
            lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2), -1) @ v, to_bhld),
        "scores matmul only": (
            lambda q, k: jnp.einsum("bhqd,bhkd->bhqk", q, k), to_bhld[:2],
            lambda q, k: q @ k.transpose(-1, -2), to_bhld[:2]),
        "softmax of [32, 4, 256, 256]": (
            lambda s: jax.nn.softmax(s, -1), [s], lambda s: torch.softmax(s, -1), [s]),
        "dense 64 -> 128 on 8,192 tokens": (
            lambda x, w: x @ w, [x, w], lambda x, w: x @ w, [x, w]),
        "exact GELU on [32, 256, 128]": (
            lambda h: jax.nn.gelu(h, approximate=False), [h],
            lambda h: torch.nn.functional.gelu(h), [h]),
        "layer norm on [32, 256, 64]": (
            lambda x: (x - x.mean(-1, keepdims=True)) * jax.lax.rsqrt(x.var(-1, keepdims=True)
                                                                     + 1e-5), [x],
            lambda x: torch.nn.functional.layer_norm(x, (D,)), [x]),
    }


def main(only):
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; jax {jax.__version__}")
    print("| part (forward + backward) | JAX ms | PyTorch ms | JAX speed / PyTorch's |")
    print("|---|---:|---:|---:|")
    for name, (fj, xj, ft, xt) in cases().items():
        if only and not any(o in name for o in only):
            continue
        r = medians({"jax": jax_fb(fj, *xj), "torch": torch_fb(ft, *xt)})
        print(f"| {name} | {r['jax']:.1f} | {r['torch']:.1f} | {r['torch'] / r['jax']:.2f}× |",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
