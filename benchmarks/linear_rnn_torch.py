"""CPU side by side: sptlib's chunked linear-RNN kernels vs the same chunked algorithms in
PyTorch (`benchmarks/peers/torch_linear_rnn.py`), forward + backward (gradients for every input),
at L = 1k / 4k / 16k.

Each row is timed interleaved (JAX, torch, JAX, torch, ...) after a warm-up, medians of
`--reps`, so load drifts hit both sides alike. Prints one markdown table: times, the ratio
torch / sptlib (> 1: sptlib faster) and each side's scaling exponent in L (the slope of
log time against log L from the shortest to the longest length; 1 = linear).

    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch==2.13.0 numpy
    PYTHONPATH=$PWD python benchmarks/linear_rnn_torch.py \
        --torch-site /tmp/torchvenv/lib/python3.11/site-packages --reps 5

(`--torch-site` appends that folder to `sys.path` after sptlib's environment, so torch comes
from the venv and everything else, numpy included, from sptlib's.) Each side runs in its own
process (XLA:CPU's compiler crashes in a process where torch has run), the parent alternating
one step on each. Before timing, each kernel's PyTorch outputs and final state are checked
against sptlib's at the shortest length.

PyTorch is never a dependency of sptlib; this script is the only place it is imported.
"""

import argparse
import math
import multiprocessing
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sptlib.kernels import linear_rnn  # noqa: E402


def _inputs(kind, b, l, h, d, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, l, h, d)).astype(np.float32)
    k = rng.standard_normal((b, l, h, d)).astype(np.float32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((b, l, h, d)).astype(np.float32)
    if kind == "gla":
        g = -np.exp(rng.uniform(np.log(1e-3), np.log(1.0), (b, l, h, d))).astype(np.float32)
        return [q, k, v, g]
    beta = (1 / (1 + np.exp(-rng.standard_normal((b, l, h))))).astype(np.float32)
    g = -np.exp(rng.uniform(np.log(1e-3), np.log(1.0), (b, l, h))).astype(np.float32)
    return [q, k, v, beta, g]


def _jax_fn(kind):
    return {"gla": linear_rnn.gated_linear_attention, "gated_deltanet": linear_rnn.delta_rule}[kind]


def _jax_side(kind, xs, chunk):
    """(step, forward) on JAX arrays: one timed forward+backward, and the outputs."""
    fn = _jax_fn(kind)
    xs = [jnp.asarray(x) for x in xs]

    def loss(xs):
        o, s = fn(*xs, chunk_size=chunk)
        return jnp.sum(o * o) + jnp.sum(s * s)
    step = jax.jit(jax.value_and_grad(loss))
    fwd = jax.jit(lambda xs: fn(*xs, chunk_size=chunk))
    return (lambda: jax.block_until_ready(step(xs)),
            lambda: [np.asarray(y) for y in fwd(xs)])


def _torch_side(kind, xs, chunk):
    import torch

    from benchmarks.peers import torch_linear_rnn as peer
    fn = {"gla": peer.gla_chunked, "gated_deltanet": peer.gated_delta_chunked}[kind]
    xs = [torch.from_numpy(x) for x in xs]

    def step():
        ys = [x.detach().requires_grad_(True) for x in xs]
        o, s = fn(*ys, chunk_size=chunk)
        torch.autograd.grad((o * o).sum() + (s * s).sum(), ys)
    return step, lambda: [y.detach().numpy() for y in fn(*xs, chunk_size=chunk)]


def _worker(conn, side, torch_site, threads):
    """One side in its own process (torch and XLA:CPU in one process crash in XLA's compiler
    once torch has run), driven by the parent: ("setup", kind, xs, chunk), ("run",),
    ("outputs",), ("stop",)."""
    if side == "torch":
        if torch_site:
            import site
            site.addsitedir(torch_site)
        import torch
        if threads:
            torch.set_num_threads(threads)
        conn.send(f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    else:
        conn.send(f"jax {jax.__version__} ({jax.default_backend()})")
    make = _torch_side if side == "torch" else _jax_side
    step = fwd = None
    while True:
        msg = conn.recv()
        if msg[0] == "setup":
            step, fwd = make(msg[1], msg[2], msg[3])
            step()  # compile / warm up
            conn.send(None)
        elif msg[0] == "run":
            t = time.perf_counter()
            step()
            conn.send(time.perf_counter() - t)
        elif msg[0] == "outputs":
            conn.send(fwd())
        else:
            return


def _time(conns, reps):
    """Interleaved medians (seconds): one step on each side in turn, `reps` rounds."""
    times = [[] for _ in conns]
    for _ in range(reps):
        for i, c in enumerate(conns):
            c.send(("run",))
            times[i].append(c.recv())
    return [statistics.median(t) for t in times]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="1024,4096,16384")
    p.add_argument("--kinds", default="gla,gated_deltanet")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=64, help="d_k = d_v per head")
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--torch-site", default="", help="a site-packages folder holding torch")
    a = p.parse_args(argv)
    ctx = multiprocessing.get_context("spawn")
    conns, procs = [], []
    for side in ("jax", "torch"):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, side, a.torch_site, a.threads))
        proc.start()
        conns.append(parent)
        procs.append(proc)
    versions = [c.recv() for c in conns]
    lengths = [int(x) for x in a.lengths.split(",")]
    print(f"{versions[0]}, {versions[1]}; batch {a.batch}, heads {a.heads}, "
          f"d_k = d_v = {a.dim}, chunk {a.chunk}, float32, forward+backward, medians of "
          f"{a.reps} interleaved")
    print("| kernel | L | sptlib (ms) | PyTorch (ms) | PyTorch / sptlib |")
    print("|---|---:|---:|---:|---:|")
    try:
        for kind in a.kinds.split(","):
            res = []
            for l in lengths:
                xs = _inputs(kind, a.batch, l, a.heads, a.dim)
                for c in conns:
                    c.send(("setup", kind, xs, a.chunk))
                for c in conns:
                    c.recv()
                if l == lengths[0]:  # the peer computes what sptlib computes
                    for c in conns:
                        c.send(("outputs",))
                    outs = [c.recv() for c in conns]
                    for x, y in zip(*outs, strict=True):
                        rel = np.linalg.norm(x - y) / np.linalg.norm(x)
                        if not rel < 1e-4:
                            raise SystemExit(f"{kind}: the PyTorch peer differs from sptlib "
                                             f"(relative {rel:.2e})")
                tj, tt = _time(conns, a.reps)
                res.append((l, tj, tt))
                print(f"| {kind} | {l} | {tj * 1e3:.1f} | {tt * 1e3:.1f} | {tt / tj:.2f} |",
                      flush=True)
            (l0, j0, t0), (l1, j1, t1) = res[0], res[-1]
            if l1 > l0:
                span = math.log(l1 / l0)
                print(f"| {kind}: scaling exponent {l0}-{l1} | | {math.log(j1 / j0) / span:.2f}"
                      f" | {math.log(t1 / t0) / span:.2f} | |", flush=True)
    finally:
        for c, proc in zip(conns, procs, strict=True):
            c.send(("stop",))
            proc.join()


if __name__ == "__main__":
    main()
