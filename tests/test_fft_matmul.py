"""The SSMs' long convolution as four-step DFT matmuls (`sptlib.kernels.fftmm`).

Truth: NumPy's float64 FFT convolution (and `direct_conv`, the O(L^2) sum, at short lengths);
gradients against `jnp.fft`'s in float64. The float64 runs check the algorithm (~1e-12); the
float32 runs check each precision's stated error bound (`fftmm.ERROR_BOUND`). Selection: the
matmul form on TPU only (`platform.fft_matmul`), forced on CPU by SPTLIB_FFT_MATMUL=1.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.kernels import conv, fftmm, platform

LENGTHS = (64, 100, 127, 1000, 3000, 4096, 16384)


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", False)


@pytest.fixture
def matmul(monkeypatch):
    monkeypatch.setenv("SPTLIB_FFT_MATMUL", "1")


def _inputs(length, batch=2, h=2, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, length, h)), rng.standard_normal((h, length)),
            rng.standard_normal((h, length)), rng.standard_normal(h))


def _numpy_conv(u, k, kb=None, d=None):
    """float64 FFT truth, causal (kb None) or two-sided (kb at lags -1..-L)."""
    length = u.shape[1]
    n = 4 * length
    kc = np.zeros((k.shape[0], n))
    kc[:, :length] = k
    if kb is not None:
        kc[:, n - length:] = kb[:, ::-1]
    y = np.fft.irfft(np.fft.rfft(u, n, axis=1) * np.fft.rfft(kc, axis=1).T[None], n,
                     axis=1)[:, :length]
    return y if d is None else y + d * u


def _rel(y, ref):
    return float(np.sqrt(np.mean((np.asarray(y, np.float64) - ref) ** 2) / np.mean(ref ** 2)))


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("causal", [True, False])
def test_equals_the_float64_fft_convolution(x64, matmul, length, causal):
    u, k, kb, d = _inputs(length, batch=1 if length > 4096 else 2)
    got = conv.ssm_conv(jnp.asarray(u), jnp.asarray(np.stack([k, kb])), jnp.asarray(d),
                        causal=causal)
    ref = _numpy_conv(u, k, None if causal else kb, d)
    assert got.dtype == jnp.float64
    assert _rel(got, ref) < 1e-12


def test_equals_the_direct_sum(x64, matmul):
    u, k, kb, d = _inputs(50)
    got = conv.fft_conv_bidirectional(jnp.asarray(u), jnp.asarray(k), jnp.asarray(kb))
    np.testing.assert_allclose(got, conv.direct_conv(u, k, k_bwd=kb), atol=1e-11)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False])
def test_equals_the_float64_fft_convolution_at_65536(x64, matmul, causal):
    u, k, kb, _ = _inputs(65536, batch=1, h=2)
    got = conv.ssm_conv(jnp.asarray(u), jnp.asarray(np.stack([k, kb])), causal=causal)
    assert _rel(got, _numpy_conv(u, k, None if causal else kb)) < 1e-12


@pytest.mark.parametrize("length", (64, 1000))
@pytest.mark.parametrize("causal", [True, False])
def test_gradients_equal_the_fft_gradients(x64, monkeypatch, length, causal):
    u, k, kb, d = map(jnp.asarray, _inputs(length, seed=1))
    w = jnp.asarray(np.random.default_rng(2).standard_normal(u.shape))

    def loss(u, kk, d):
        return jnp.sum(w * conv.ssm_conv(u, kk, d, causal=causal))

    kk = jnp.stack([k, kb])
    grads = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("SPTLIB_FFT_MATMUL", flag)
        grads[flag] = jax.grad(loss, argnums=(0, 1, 2))(u, kk, d)
    for a, b in zip(grads["1"], grads["0"]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10 * float(jnp.max(jnp.abs(b))))


@pytest.mark.parametrize("precision", ["float32", "bf16x3"])
@pytest.mark.parametrize("length", (64, 1000, 4096))
def test_float32_error_within_the_stated_bound(matmul, monkeypatch, precision, length):
    monkeypatch.setenv("SPTLIB_FFT_MATMUL_PRECISION", precision)
    u, k, kb, _ = _inputs(length)
    got = conv.fft_conv_bidirectional(jnp.asarray(u, jnp.float32), jnp.asarray(k, jnp.float32),
                                      jnp.asarray(kb, jnp.float32))
    assert got.dtype == jnp.float32
    err = _rel(got, _numpy_conv(u, k, kb))
    assert err < fftmm.ERROR_BOUND[precision]
    # ... and the stated bound is not slack by orders of magnitude.
    assert err > fftmm.ERROR_BOUND[precision] / 100


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float32", "bf16x3"])
@pytest.mark.parametrize("length", (16384, 65536))
def test_float32_error_within_the_stated_bound_when_long(precision, length):
    u, k, _, _ = _inputs(length, batch=1, h=2)
    n = fftmm.supported_size(2 * length)
    kc = jnp.pad(jnp.asarray(k, jnp.float32), ((0, 0), (0, n - length)))
    got = fftmm.circular_conv(jnp.asarray(u, jnp.float32), kc, precision=precision)
    assert _rel(got, _numpy_conv(u, k)) < fftmm.ERROR_BOUND[precision]


def test_bf16_single_pass_exceeds_the_bound_and_is_refused(monkeypatch):
    """The refusal is earned: one bf16 pass measures above MAX_ERROR (bypassing the check)."""
    u, k, _, _ = _inputs(1000)
    n = fftmm.supported_size(2000)
    kc = jnp.pad(jnp.asarray(k, jnp.float32), ((0, 0), (0, n - 1000)))
    monkeypatch.setitem(fftmm.ERROR_BOUND, "bf16", 0.0)
    got = fftmm.circular_conv(jnp.asarray(u, jnp.float32), kc, precision="bf16")
    assert fftmm.MAX_ERROR < _rel(got, _numpy_conv(u, k)) < 1e-2
    monkeypatch.undo()
    with pytest.raises(ValueError, match="'bf16' refused"):
        fftmm.circular_conv(jnp.asarray(u, jnp.float32), kc, precision="bf16")
    monkeypatch.setenv("SPTLIB_FFT_MATMUL", "1")
    monkeypatch.setenv("SPTLIB_FFT_MATMUL_PRECISION", "bf16")
    with pytest.raises(ValueError, match="'bf16' refused"):
        conv.fft_conv(jnp.asarray(u, jnp.float32), jnp.asarray(k, jnp.float32))
    monkeypatch.setenv("SPTLIB_FFT_MATMUL_PRECISION", "fp8")
    with pytest.raises(ValueError, match="not in"):
        conv.fft_conv(jnp.asarray(u, jnp.float32), jnp.asarray(k, jnp.float32))


def test_sizes_pad_to_the_fft_size_and_factor_into_blocks():
    for n in (2, 128, 129, 200, 2000, 6000, 8192, 32768, 1 << 17):
        m = fftmm.supported_size(n)
        assert m == conv.fft_size(n) >= n
        assert np.prod(fftmm.blocks(m)) == m and max(fftmm.blocks(m)) <= fftmm.MAX_BLOCK
    assert fftmm.blocks(32768) == (256, 128) and fftmm.blocks(1 << 17) == (64, 64, 32)
    assert fftmm.blocks(128) == (128,) and fftmm.blocks(1600) == (40, 40)
    with pytest.raises(ValueError, match="exceeds the largest supported 131072"):
        fftmm.supported_size(2 * 65537)
    with pytest.raises(ValueError, match="prime factor"):
        fftmm.blocks(257)


def test_selected_on_tpu_only(monkeypatch):
    monkeypatch.delenv("SPTLIB_FFT_MATMUL", raising=False)
    assert platform.fft_matmul("tpu")
    assert not platform.fft_matmul("cpu") and not platform.fft_matmul("gpu")
    monkeypatch.setenv("SPTLIB_FFT_MATMUL", "1")
    assert platform.fft_matmul("cpu")
    monkeypatch.setenv("SPTLIB_FFT_MATMUL", "0")
    assert not platform.fft_matmul("tpu")
    monkeypatch.setenv("SPTLIB_FFT_MATMUL", "yes")
    with pytest.raises(ValueError, match="SPTLIB_FFT_MATMUL='yes'"):
        platform.fft_matmul("tpu")


def _deep(jaxpr):
    """Every primitive name in a jaxpr and its sub-jaxprs (pjit, custom_vjp, ...)."""
    out = set()
    for e in jaxpr.eqns:
        out.add(e.primitive.name)
        for v in e.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    out |= _deep(inner)
    return out


def test_a_trace_for_tpu_has_no_fft_op(monkeypatch):
    """Traced for a TPU, the layer's convolution is matmuls; for the CPU it stays an FFT."""
    monkeypatch.delenv("SPTLIB_FFT_MATMUL", raising=False)
    u, k, kb, d = (jnp.asarray(a, jnp.float32) for a in _inputs(256))
    fn = lambda u, kk: conv.ssm_conv(u, kk, d, causal=False)  # noqa: E731
    kk = jnp.stack([k, kb])
    monkeypatch.setattr(platform, "target_platform", lambda: "tpu")
    tpu = _deep(jax.make_jaxpr(jax.grad(lambda u, kk: fn(u, kk).sum(), (0, 1)))(u, kk).jaxpr)
    assert "fft" not in tpu and "dot_general" in tpu
    monkeypatch.setattr(platform, "target_platform", lambda: "cpu")
    monkeypatch.setenv("SPTLIB_NATIVE", "0")
    assert "fft" in _deep(jax.make_jaxpr(fn)(u, kk).jaxpr)


def _dot_precisions(jaxpr):
    out = []
    for e in jaxpr.eqns:
        if e.primitive.name == "dot_general":
            out.append((str(e.params["precision"]), e.invars[0].aval.dtype.name))
        for v in e.params.values():
            inner = getattr(v, "jaxpr", v)
            if hasattr(inner, "eqns"):
                out += _dot_precisions(inner)
    return out


def test_bf16x3_is_the_mxus_bf16_3x_on_tpu_and_emulated_elsewhere(monkeypatch):
    """Traced for a TPU, bf16x3 is f32 dots at Precision.HIGH (XLA:TPU's bf16_3x: the split
    stays inside the MXU); elsewhere the same three bf16 products, written out (what the CPU
    tests measure the error of)."""
    u = jnp.zeros((1, 64, 2), jnp.float32)
    kc = jnp.zeros((2, 128), jnp.float32)
    # A fresh function per trace: make_jaxpr caches traces by function.
    def fn():
        return functools.partial(fftmm.circular_conv, precision="bf16x3")
    monkeypatch.setattr(platform, "target_platform", lambda: "tpu")
    tpu = _dot_precisions(jax.make_jaxpr(fn())(u, kc).jaxpr)
    assert tpu and all("HIGH" in p and "HIGHEST" not in p and dt == "float32" for p, dt in tpu)
    monkeypatch.setattr(platform, "target_platform", lambda: "cpu")
    cpu = _dot_precisions(jax.make_jaxpr(fn())(u, kc).jaxpr)
    assert len(cpu) == 3 * len(tpu) and all(dt == "bfloat16" for _, dt in cpu)
