"""The quickstart-size Transformer train step: sptlib with and without `nn.scan`, plain Flax, torch.

    python benchmarks/transformer_step_ab.py [rolled,default,plainattn,xladots,noscan,flax,torch]   # torch: optional

sptlib's engine step of `sptlib.bench.peers.TRANSFORMER_CONFIG` (batch 32 x 256 tokens, 2 x 64,
AdamW) as built by `sptlib.bench.train_step.prepare`: as configured (`default`: the local
configs unroll the scanned layer loop, `model.scan_unroll = n_layers`), with the loop rolled
(`rolled`: `model.scan_unroll=1`, the library default), with the jnp attention instead of the
fused CPU kernel (`plainattn`: `model.attention.kernel="reference"`), with XLA's dots for the small
weights' gradients instead of `sptlib.kernels.linear`'s kernel (`xladots`) and with `model.scan_layers=False`
(`noscan`: named layers, other parameter paths); the plain Flax Linen floor and
`nn.TransformerEncoder` (`benchmarks/peers/`). Interleaved (A, B, C, D, A, ...), 3 warm-up steps each, `ROUNDS` (15)
rounds, medians; `SETTLE` seconds of pause before each timed call (default 0; see
benchmarks/peer_interference.py). Results: the history of docs/performance_notes.md (git show ded39a6:docs/performance_notes.md).
"""

import os
import statistics
import sys
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sptlib.bench import peers  # noqa: E402
from sptlib.bench import train_step as bt  # noqa: E402

TOKENS = 32 * 256
SETTLE = float(os.environ.get("SETTLE", "0"))  # seconds of pause before each timed call


def prepare(overrides):
    """`sptlib.bench.train_step.prepare` of the peer config with `dotted.key: value` overrides."""
    orig = bt.load_config

    def load(spec):
        c = orig(spec)
        with c.unlocked():
            for key, value in overrides.items():
                *path, last = key.split(".")
                node = c
                for p in path:
                    node = node[p]
                node[last] = value
        return c
    bt.load_config = load
    try:
        p = bt.prepare(peers.TRANSFORMER_CONFIG, max_tokens=TOKENS)
    finally:
        bt.load_config = orig
    return p


def sptlib_step(overrides):
    step = bt.step_closure(prepare(overrides))
    return lambda: jax.block_until_ready(step())


def xla_dots_step():
    """The default step with XLA's dots for the weight gradients (no `sptlib.kernels.linear`
    kernel): the kernel is switched off while the step is traced."""
    from sptlib.kernels import linear
    orig = linear._cpu_kernel_ok
    linear._cpu_kernel_ok = lambda *a: False
    try:
        step = sptlib_step({})
        step()  # traces and compiles now
    finally:
        linear._cpu_kernel_ok = orig
    return step


def make(name):
    if name == "default":
        return sptlib_step({})
    if name == "rolled":
        return sptlib_step({"model.scan_unroll": 1})
    if name == "plainattn":
        return sptlib_step({"model.attention.kernel": "reference"})
    if name == "xladots":
        return xla_dots_step()
    if name == "noscan":
        return sptlib_step({"model.scan_layers": False})
    if name == "flax":
        from benchmarks.peers import flax_transformer
        step = flax_transformer.make_step(256, 32, num_classes=4)
        return lambda: jax.block_until_ready(step())
    if name == "torch":
        from benchmarks.peers import torch_transformer
        return torch_transformer.make_step(256, 32)
    raise SystemExit(f"unknown variant {name!r}; known: rolled, default, plainattn, xladots, noscan, "
                     "flax, torch")


def main(names):
    fns = {n: make(n) for n in names}
    for f in fns.values():
        for _ in range(3):
            f()
    ts = {n: [] for n in fns}
    for _ in range(int(os.environ.get("ROUNDS", "15"))):
        for n, f in fns.items():
            time.sleep(SETTLE)
            t = time.perf_counter()
            f()
            ts[n].append(time.perf_counter() - t)
    med = {n: statistics.median(t) for n, t in ts.items()}
    first = med[names[0]]
    for n, m in med.items():
        print(f"{n:8s} {1e3 * m:7.1f} ms  {TOKENS / m:8.0f} tokens/s  {first / m:.2f}x of {names[0]}",
              flush=True)


if __name__ == "__main__":
    main((sys.argv[1] if len(sys.argv) > 1 else "rolled,default,noscan,flax,torch").split(","))
