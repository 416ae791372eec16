"""SSM kernels against independent truths: recurrent scans, direct convolution, NumPy formulas."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib import kernels
from sptlib.kernels import s4 as s4k

RNG = np.random.default_rng(0)


def cplx(*shape, scale=1.0):
    z = RNG.normal(size=shape) + 1j * RNG.normal(size=shape)
    return jnp.asarray(z * scale, jnp.complex64)


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.abs(a - b).max() / np.abs(b).max()


LOG_DT = jnp.asarray(np.log([1e-3, 1e-2, 1e-1]), jnp.float32)


@pytest.mark.parametrize("length", [7, 100, 257])
def test_fft_conv_equals_direct(length):
    u = RNG.normal(size=(2, length, 3)).astype(np.float32)
    k = RNG.normal(size=(3, length)).astype(np.float32)
    kb = RNG.normal(size=(3, length)).astype(np.float32)
    d = RNG.normal(size=3).astype(np.float32)
    np.testing.assert_allclose(kernels.fft_conv(u, k, d), kernels.direct_conv(u, k, d),
                               atol=2e-4, rtol=1e-4)
    np.testing.assert_allclose(kernels.fft_conv(u, k), kernels.direct_conv(u, k),
                               atol=2e-4, rtol=1e-4)
    np.testing.assert_allclose(kernels.fft_conv_bidirectional(u, k, kb, d),
                               kernels.direct_conv(u, k, d, k_bwd=kb), atol=2e-4, rtol=1e-4)


def test_fft_size_is_fast_and_large_enough():
    for n in [1, 2, 7, 1000, 2000, 2049, 32768, 20001]:
        m = kernels.fft_size(n)
        assert m >= n
        r = m
        for p in (2, 3, 5):
            while r % p == 0:
                r //= p
        assert r == 1
    assert kernels.fft_size(2000) == 2000 and kernels.fft_size(2049) == 2160


@pytest.mark.parametrize("disc", ["zoh", "bilinear"])
def test_s4d_kernel_equals_numpy_formula(disc):
    h, n2, length = 3, 8, 50
    a, _ = kernels.s4d_init(2 * n2, "inv")
    A = np.tile(a, (h, 1))
    B, C = np.asarray(cplx(h, n2)), np.asarray(cplx(h, n2))
    dt = np.exp(np.asarray(LOG_DT, np.float64))[:, None]
    k = np.arange(length)
    if disc == "zoh":
        coef = C * B * (np.exp(dt * A) - 1) / A
        z = np.exp(dt * A)
    else:
        coef = C * B * dt / (1 - dt * A / 2)
        z = (1 + dt * A / 2) / (1 - dt * A / 2)
    want = 2 * np.real(np.einsum("hn,hnk->hk", coef, z[..., None] ** k))
    got = kernels.s4d_kernel(jnp.asarray(A, jnp.complex64), jnp.asarray(B), jnp.asarray(C), LOG_DT,
                             length, disc)
    assert rel_err(got, want) < 1e-5


@pytest.mark.parametrize("disc,length", [("zoh", 1024), ("bilinear", 300)])
def test_s4d_conv_equals_recurrence(disc, length):
    h, n2 = 3, 16
    a, _ = kernels.s4d_init(2 * n2, "lin")
    A = jnp.asarray(np.tile(a, (h, 1)), jnp.complex64)
    B, C = cplx(h, n2), cplx(h, n2)
    got = kernels.s4d_kernel(A, B, C, LOG_DT, length, disc)
    want = kernels.s4d_recurrent_kernel(A, B, C, LOG_DT, length, disc)
    assert rel_err(got, want) < 1e-4


def test_s4d_kernel_leading_dims():
    h, n2 = 3, 4
    A = jnp.asarray(np.tile(kernels.s4d_init(2 * n2, "legs")[0], (h, 1)), jnp.complex64)
    B, C = cplx(h, n2), cplx(2, h, n2)
    both = kernels.s4d_kernel(A, B, C, LOG_DT, 33)
    np.testing.assert_allclose(both[1], kernels.s4d_kernel(A, B, C[1], LOG_DT, 33),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("length", [1024])
def test_s4_dplr_conv_equals_recurrence(length):
    h, n = 3, 32
    lam, p, b, _ = kernels.nplr_legs(n)
    tile = lambda v: jnp.asarray(np.tile(v, (h, 1)), jnp.complex64)  # noqa: E731
    C = cplx(h, n // 2)
    got = kernels.s4_kernel(tile(lam), tile(p), tile(b), C, LOG_DT, length)
    want = kernels.s4_recurrent_kernel(tile(lam), tile(p), tile(b), C, LOG_DT, length)
    assert rel_err(got, want) < 1e-4
    # the O(N) Woodbury step equals the dense recurrence
    c = kernels.s4_output_matrix(tile(lam), tile(p), tile(b), C, LOG_DT, length)
    x = jnp.zeros((1, h, n), jnp.complex64)
    ks = []
    for t in range(5):
        x = kernels.s4_step(x, jnp.full((1, h), float(t == 0)), tile(lam), tile(p), tile(b), LOG_DT)
        ks.append(jnp.sum(c * x, -1).real[0])
    assert rel_err(jnp.stack(ks, 1), want[:, :5]) < 1e-4


def test_s4_chunked_cauchy_equals_dense():
    """Chunked Cauchy sums (lax.map over blocks of nodes, padded last block) give the dense
    kernel and the dense gradients; bidirectional C (leading dim 2)."""
    h, n, length, chunk = 3, 16, 256, 50  # 129 nodes: 3 blocks of 50, the last one padded
    lam, p, b, _ = kernels.nplr_legs(n)
    tile = lambda v: jnp.asarray(np.tile(v, (h, 1)), jnp.complex64)  # noqa: E731
    args = (tile(lam), tile(p), tile(b), cplx(2, h, n // 2), LOG_DT)

    w = jnp.asarray(RNG.normal(size=(2, h, length)), jnp.float32)

    def grads(cauchy_chunk):
        def loss(*a):
            return jnp.sum(w * kernels.s4_kernel(*a, length, cauchy_chunk=cauchy_chunk))
        return jax.jit(jax.grad(loss, argnums=range(5)))(*args)

    dense = kernels.s4_kernel(*args, length, cauchy_chunk=length)  # one block = the dense form
    chunked = jax.jit(lambda *a: kernels.s4_kernel(*a, length, cauchy_chunk=chunk))(*args)
    assert rel_err(chunked, dense) < 1e-5
    for gc, gd in zip(grads(chunk), grads(length)):
        assert bool(jnp.any(gd != 0))
        for part in (jnp.real, jnp.imag) if jnp.iscomplexobj(gd) else (jnp.real,):
            assert rel_err(part(gc), part(gd)) < 1e-4


def test_s4_cauchy_chunk_size():
    assert s4k.cauchy_chunk_size(3, 8, 129) == 129  # fits in one block: dense
    # 256 x 32 x 8193 nodes > 2^22 elements -> balanced blocks under the cap
    c = s4k.cauchy_chunk_size(256, 32, 8193)
    blocks = -(-8193 // c)
    assert c * 256 * 32 <= s4k.CAUCHY_BLOCK_ELEMS and blocks * c - 8193 < blocks
    assert s4k.cauchy_chunk_size(1, 1, 10, block_elems=3) == 3  # 4 blocks of 3 (2 padded)


def test_s4_kernel_grad_memory_at_16k():
    """Forward+backward of the S4 kernel at H=256, N=64, L=16384 plans well under the ~3.1 GiB
    of the dense Cauchy evaluation (compile only; XLA's own buffer assignment)."""
    h, n, length = 256, 64, 16384
    lam, p, b, _ = kernels.nplr_legs(n)
    tile = lambda v: jnp.asarray(np.tile(v, (h, 1)), jnp.complex64)  # noqa: E731
    args = (tile(lam), tile(p), tile(b), cplx(2, h, n // 2), jnp.zeros((h,), jnp.float32))
    f = jax.grad(lambda *a: jnp.sum(kernels.s4_kernel(*a, length) ** 2), argnums=range(5))
    mem = jax.jit(f).lower(*args).compile().memory_analysis()
    assert mem.temp_size_in_bytes < 512 * 2 ** 20, mem.temp_size_in_bytes


def test_nplr_legs_reconstructs_hippo():
    n = 16
    lam, p, b, v = kernels.nplr_legs(n)
    V = np.concatenate([v, v.conj()], 1)
    full = lambda x: np.concatenate([x, x.conj()])  # noqa: E731
    a = V @ (np.diag(full(lam)) - np.outer(full(p), full(p).conj())) @ V.conj().T
    a0, b0 = kernels.hippo_legs(n)
    np.testing.assert_allclose(a, a0, atol=1e-10)
    np.testing.assert_allclose(V @ full(b), b0, atol=1e-10)
    # spot-check the HiPPO-LegS definition
    assert a0[2, 1] == -np.sqrt(5 * 3) and a0[1, 1] == -2 and a0[1, 2] == 0


@pytest.mark.parametrize("version", ["exp", "softmax"])
def test_dss_conv_equals_recurrence(version):
    h, n, length = 3, 16, 512
    if version == "exp":
        re = -np.exp(RNG.normal(size=n))
        log_dt = LOG_DT
    else:  # unrestricted real parts: growing modes too
        re = RNG.normal(size=n) * 0.5
        log_dt = jnp.asarray(np.log([1e-3, 1e-2, 3e-2]), jnp.float32)
    lam = jnp.asarray(re + 3j * RNG.normal(size=n), jnp.complex64)
    W = cplx(h, n)
    got = kernels.dss_kernel(lam, W, log_dt, length, version)
    want = kernels.dss_recurrent_kernel(lam, W, log_dt, length, version)
    assert rel_err(got, want) < 1e-4


def test_dlr_conv_equals_recurrence():
    h, n, length = 3, 64, 1024
    ll = kernels.dlr_log_lambda(jnp.asarray(RNG.uniform(0.01, 0.3, n), jnp.float32),
                                jnp.asarray(RNG.uniform(0, 2 * np.pi, n), jnp.float32))
    C = cplx(h, n)
    assert rel_err(kernels.dlr_kernel(ll, C, length),
                   kernels.dlr_recurrent_kernel(ll, C, length)) < 1e-4


@pytest.mark.parametrize("length", [1, 37, 256])
def test_vandermonde_shared_modes_equal_naive_sum(length):
    # Shared modes take the direct [N, L] Vandermonde path, per-channel ones the blocked
    # path: both must equal the naive double sum (float64 NumPy).
    h, n = 3, 40
    log_z = (-RNG.uniform(1e-3, 0.2, n) + 1j * RNG.uniform(0, 2 * np.pi, n)).astype(np.complex64)
    coef = cplx(2, h, n)
    want = np.real(np.einsum("bhn,nl->bhl", np.asarray(coef, np.complex128),
                             np.exp(np.asarray(log_z, np.complex128)[:, None] * np.arange(length))))
    shared = kernels.vandermonde_sum(coef, jnp.asarray(log_z), length)
    tiled = kernels.vandermonde_sum(coef, jnp.tile(jnp.asarray(log_z), (h, 1)), length)
    assert shared.shape == tiled.shape == (2, h, length)
    assert rel_err(shared, want) < 1e-5 and rel_err(tiled, want) < 1e-5


@pytest.mark.parametrize("disc", ["zoh", "bilinear"])
def test_s5_parallel_scan_equals_sequential(disc):
    p2, h, length = 8, 3, 500
    lam, _, _, _ = kernels.nplr_legs(2 * p2)
    log_dt = jnp.asarray(np.log(RNG.uniform(1e-3, 1e-1, p2)), jnp.float32)
    dlam, db = kernels.s5_discretize(jnp.asarray(lam, jnp.complex64), cplx(p2, h), log_dt, disc)
    bu = kernels.s5_input(db, jnp.asarray(RNG.normal(size=(2, length, h)), jnp.float32))
    for rev in (False, True):
        got = kernels.s5_scan(dlam, bu, reverse=rev)
        want = kernels.s5_recurrent(dlam, bu, reverse=rev)
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


def test_kernels_stable_at_16k():
    """fp32 kernels stay finite at L = 16384 (no overflow in the Vandermonde / Cauchy sums)."""
    h, n = 4, 64
    length = 16384
    lam, p, b, _ = kernels.nplr_legs(n)
    tile = lambda v: jnp.asarray(np.tile(v, (h, 1)), jnp.complex64)  # noqa: E731
    log_dt = jnp.asarray(np.log([1e-4, 1e-3, 1e-2, 1e-1]), jnp.float32)
    ks = [kernels.s4_kernel(tile(lam), tile(p), tile(b), cplx(h, n // 2), log_dt, length),
          kernels.s4d_kernel(tile(lam), tile(b), cplx(h, n // 2), log_dt, length),
          kernels.dss_kernel(jnp.asarray(-lam.conj(), jnp.complex64), cplx(h, n // 2), log_dt,
                             length, "softmax")]
    for k in ks:
        assert k.shape == (h, length) and bool(jnp.all(jnp.isfinite(k)))


def test_kernels_jit_and_grad():
    h, n2 = 2, 4
    A = jnp.asarray(np.tile(kernels.s4d_init(2 * n2)[0], (h, 1)), jnp.complex64)
    B, C = cplx(h, n2), cplx(h, n2)

    @jax.jit
    def loss(log_dt):
        return jnp.sum(kernels.s4d_kernel(A, B, C, log_dt, 64) ** 2)

    g = jax.grad(loss)(LOG_DT[:h])
    assert bool(jnp.all(jnp.isfinite(g))) and bool(jnp.any(g != 0))


def test_import_without_tensorflow():
    code = ("import sys, sptlib.kernels, sptlib.layers, sptlib.layers.ssm, sptlib.layers.gss; "
            "bad = [m for m in sys.modules if m == 'tensorflow' or m.startswith('tensorflow.')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
