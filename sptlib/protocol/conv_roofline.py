r"""Per-op best case and HBM roofline of one SSM convolution layer on a v4 chip (libtpu, no TPU).

    python -m sptlib.protocol.conv_roofline                     # PathX S4 / S4D / DSS, markdown
    python -m sptlib.protocol.conv_roofline --models=s4d --fft=both

For each model's PathX recipe (`experiments/lra.py:pathx,<model>,spt-masked`, the pretraining
stage: bidirectional, its batch over the v4-16 slice's 8 chips) one layer's forward + backward
(gradients w.r.t. the parameters and the input) is compiled for ONE v4 chip with libtpu, whole
and in pieces (at `sptlib.aot`'s default `--effort=-1`), and each program's `optimal_seconds` (libtpu's cost model: every op at its
roofline, perfect overlap) is reported:

    layer       the mixer block (`sptlib.layers`), as a model calls it
    kernel      the SSM kernel generation alone (`ssm.kernel(L)`: Vandermonde / Cauchy)
    conv        the long convolution alone (`kernels.ssm_conv`, kernel and input given)
    post        GELU + the GLU out-projection (Dense d -> 2d) alone

with `--fft=fft` (`SPTLIB_FFT_MATMUL=0`: XLA's FFT op), `matmul` (`sptlib.kernels.fftmm`, what
TPU traces use) or `both`. The roofline row is the layer's minimum HBM traffic over v4's
bandwidth (`HBM_BYTES_PER_S`): forward reads the input x [B, L, d] and the parameters and writes
y; the backward reads dy, x (or recomputes from it) and the parameters and writes dx and the
parameter gradients: 2 reads + 1 write of [B, L, d] float32 forward, 3 reads + 1 write backward
(6 activation passes in all at 4 bytes), plus 3 parameter-sized passes. Nothing else must touch
HBM: the kernel [H, L], its spectrum, and the FFT's intermediates can live in VMEM only in a
fused kernel, so the roofline is what a perfect fusion would reach, not what XLA can.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

# v4: 1.2 TB/s HBM per chip (Google Cloud TPU v4 data sheet, 1,200 GB/s; Jouppi et al. 2023);
# peak 275 TFLOP/s bf16 (`sptlib.slices.topologies`).
HBM_BYTES_PER_S = 1.2e12
CHIPS = 8  # v4-16: 8 chips (megacore), the PathX slice
MODELS = ("s4", "s4d", "dss")


@contextlib.contextmanager
def _env(name, value):
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _setup(model):
    """(mixer class kwargs, batch per chip, length, d_model) of the PathX pretraining recipe."""
    from sptlib.configs import common  # deferred: the CLI's --help stays fast
    from sptlib.data import task_info  # deferred: as above
    config = common.load_module(os.path.join(common.EXPERIMENTS_DIR, "lra.py")).get_config(
        f"pathx,{model},spt-masked")
    m = config.model
    stage = config.stages[config.stage_order[0]]
    length = int(task_info(config.data)["max_length"])
    return (m.mixer, dict(m[m.mixer]), int(stage.batch_size) // CHIPS, length, int(m.d_model),
            bool(m.causal))


def profile(model, fft_mode, device):
    """{piece: optimal_seconds} for one layer of `model` on `device` (a v4 chip)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from sptlib import kernels, layers  # deferred: the CLI's --help stays fast

    mixer, kw, batch, length, d, causal = _setup(model)
    mesh = Mesh(np.array([device]), ("data",))
    rep = NamedSharding(mesh, PartitionSpec())

    def sds(tree):
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), tree)

    def best(fn, *args):
        with jax.set_mesh(mesh):
            # effort -1 as `sptlib.aot` (its default): long FFTs compile ~10x faster.
            compiled = jax.jit(fn).lower(*sds(args)).compile(
                compiler_options={"exec_time_optimization_effort": -1.0})
        return float(compiled.cost_analysis()["optimal_seconds"])

    cls = layers.get_mixer(mixer)
    layer = cls(d_model=d, causal=causal, dropout=0.0, **kw)
    x = jnp.zeros((batch, length, d), jnp.float32)
    params = jax.eval_shape(lambda: layer.init(jax.random.key(0), x[:1, :256]))
    out = {}
    env = {"fft": "0", "matmul": "1"}[fft_mode]
    with _env("SPTLIB_FFT_MATMUL", env), _env("SPTLIB_NATIVE", "0"):
        def whole(p, x):
            return jnp.sum(layer.apply(p, x) * x)
        out["layer"] = best(jax.grad(whole, (0, 1)), params, x)

        def kern(p):
            return jnp.sum(layer.apply(p, length, method=lambda m, n: m.ssm.kernel(n)))
        out["kernel"] = best(jax.grad(kern), params)
        n_dir = 1 if causal else 2
        k = jnp.zeros((n_dir, d, length), jnp.float32)

        def conv(x, k):
            return jnp.sum(kernels.ssm_conv(x, k, jnp.ones((d,)), causal=causal) * x)
        out["conv"] = best(jax.grad(conv, (0, 1)), x, k)

        w = jnp.zeros((d, 2 * d), jnp.float32)

        def post(x, w):
            y = jax.nn.gelu(x, approximate=True) @ w
            a, b = jnp.split(y, 2, axis=-1)
            return jnp.sum(a * jax.nn.sigmoid(b))
        out["post"] = best(jax.grad(post, (0, 1)), x, w)
    n_params = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))
    act = batch * length * d * 4
    out["roofline"] = (6 * act + 3 * 4 * n_params) / HBM_BYTES_PER_S
    out["shape"] = f"B {batch}/chip, L {length}, d {d}, {'causal' if causal else 'bidirectional'}"
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="sptlib.protocol.conv_roofline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--fft", choices=("fft", "matmul", "both"), default="both")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    for m in models:
        if m not in MODELS:
            print(f"conv_roofline: error: --models: {m!r} not in {MODELS}", file=sys.stderr)
            sys.exit(2)
    import jax

    from sptlib.slices import topologies  # deferred: needs libtpu, only when compiling
    jax.config.update("jax_platforms", "cpu")
    device = topologies.devices(topologies.slice_spec("v4-8"))[0]
    modes = ("fft", "matmul") if args.fft == "both" else (args.fft,)
    print("| model | shape (per chip) | FFT | layer fwd+bwd (ms) | kernel gen | conv | "
          "GELU+GLU proj | HBM roofline (ms) | layer / roofline |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m in models:
        for mode in modes:
            r = profile(m, mode, device)
            ms = {k: v * 1e3 for k, v in r.items() if k != "shape"}
            print(f"| {m} | {r['shape']} | {mode} | {ms['layer']:.3f} | {ms['kernel']:.3f} | "
                  f"{ms['conv']:.3f} | {ms['post']:.3f} | {ms['roofline']:.3f} | "
                  f"{r['layer'] / r['roofline']:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
