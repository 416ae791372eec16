"""The native XLA:CPU FFT convolution (C++ via XLA FFI) against direct convolution and jnp.fft."""

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.kernels import conv
from sptlib.kernels.platform.cpu import build as native
from tests.test_fused_attention import run_python

# Skipped only where the machine has no C++ compiler (then sptlib runs the jnp convolution; see
# tests/test_fused_attention.py for the fallback): with one, a kernel that fails to build fails.
pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C++ compiler")


def _case(batch, length, channels, seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.normal(size=s).astype(np.float32))
    return f(batch, length, channels), f(channels, length) * 0.2, f(channels, length) * 0.2, f(
        channels), f(batch, length, channels)


def _jnp_conv(u, k, d, k_bwd=None):
    """The jnp.fft path (autodiff gives its gradients), as used off CPU."""
    length = u.shape[1]
    n = conv.fft_size(2 * length)
    if k_bwd is None:
        k_f = jnp.fft.rfft(k, n=n, axis=-1).T
    else:
        k_f = conv.bidirectional_kernel_spectrum(k, k_bwd, length, n)
    return conv._conv_with_spectrum(u, k_f, n, d)


# Odd batch (one transform holds a single element), channels not a multiple of the 8 lanes,
# lengths that are and are not powers of two; FFT sizes 2 and 4 (a lone radix-2 stage, a lone
# radix-4 stage) up to 4096 and 8192 (log2 n even and odd: radix-4 stages with and without a
# radix-2 one).
@pytest.mark.parametrize("batch,length,channels", [(3, 37, 11), (2, 64, 8), (1, 100, 19),
                                                   (4, 256, 16), (2, 1, 3), (2, 2, 5),
                                                   (1, 1500, 16), (1, 3000, 9)])
def test_forward_matches_direct_convolution(batch, length, channels):
    u, k, kb, d, _ = _case(batch, length, channels)
    # The outputs' scale (and float32 rounding with it) grows as sqrt(length).
    atol = 3e-6 * max(1.0, (length / 256) ** 0.5)
    np.testing.assert_allclose(jax.jit(conv.fft_conv)(u, k, d), conv.direct_conv(u, k, d),
                               atol=atol)
    np.testing.assert_allclose(jax.jit(conv.fft_conv_bidirectional)(u, k, kb, d),
                               conv.direct_conv(u, k, d, k_bwd=kb), atol=atol)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch,length,channels", [(3, 37, 11), (4, 128, 16)])
def test_gradients_match_jnp_fft(batch, length, channels, bidirectional):
    u, k, kb, d, w = _case(batch, length, channels)
    if bidirectional:
        ours = lambda u, k, kb, d: conv.fft_conv_bidirectional(u, k, kb, d)
        ref = lambda u, k, kb, d: _jnp_conv(u, k, d, kb)
    else:
        ours = lambda u, k, kb, d: conv.fft_conv(u, k, d)
        ref = lambda u, k, kb, d: _jnp_conv(u, k, d)
    loss = lambda f: lambda *a: jnp.sum(f(*a) * w)
    got = jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2, 3)))(u, k, kb, d)
    want = jax.grad(loss(ref), argnums=(0, 1, 2, 3))(u, k, kb, d)
    for name, a, b in zip(("u", "k", "k_bwd", "d"), got, want):
        scale = float(np.abs(np.asarray(b)).max())
        if not bidirectional and name == "k_bwd":
            assert scale == 0 and np.all(np.asarray(a) == 0)
            continue
        assert scale > 1e-2, name
        np.testing.assert_allclose(a, b, atol=2e-6 * max(1.0, scale), err_msg=name)


def test_native_kernel_is_in_the_cpu_program_only():
    u, k, _, d, _ = _case(2, 32, 8)
    f = jax.jit(lambda u, k: conv.fft_conv(u, k, d))
    cpu = f.trace(u, k).lower(lowering_platforms=("cpu",)).as_text()
    tpu = f.trace(u, k).lower(lowering_platforms=("tpu",)).as_text()
    assert "sptlib_fft_conv_fwd" in cpu and "sptlib_fft_conv_fwd" not in tpu


def test_sharded_batch_and_channels_on_a_4_device_mesh():
    """Per-shard kernels (no all-gather); the kernel gradient is summed over batch shards."""
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from sptlib.kernels import conv
        rng = np.random.default_rng(0)
        u, w = (jnp.asarray(rng.normal(size=(4, 40, 16)).astype(np.float32)) for _ in range(2))
        k = jnp.asarray(rng.normal(size=(16, 40)).astype(np.float32)) * 0.2
        loss = lambda u, k: jnp.sum(conv.fft_conv(u, k) * w)
        ref = jax.grad(loss, argnums=(0, 1))(u, k)
        mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"))
        for spec, kspec in ((P("x"), P()), (P("x", None, "y"), P("y")), (P(None, None, "y"),
                                                                          P("y"))):
            args = (jax.device_put(u, NamedSharding(mesh, spec)),
                    jax.device_put(k, NamedSharding(mesh, kspec)))
            f = jax.jit(jax.grad(loss, argnums=(0, 1)))
            assert "all-gather" not in f.lower(*args).compile().as_text(), spec
            for a, b in zip(f(*args), ref):
                np.testing.assert_allclose(a, b, atol=2e-5)
        print("ok")
    """)
    out = run_python(code, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
