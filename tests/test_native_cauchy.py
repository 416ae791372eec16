"""The native XLA:CPU Cauchy sums of the S4 kernel (C++ via XLA FFI) against the jnp evaluation
(its values and its autodiff gradients), on one device and sharded over channels."""

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib import kernels
from sptlib.kernels.platform.cpu import build as native
from sptlib.kernels import s4 as s4k
from tests.test_fused_attention import run_python

pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C++ compiler")


def _args(h, n, c, seed=0):
    rng = np.random.default_rng(seed)
    lam, p, b, _ = kernels.nplr_legs(n)
    tile = lambda v: jnp.asarray(np.tile(v, (h, 1)), jnp.complex64)  # noqa: E731
    cc = rng.normal(size=(c, h, n // 2)) + 1j * rng.normal(size=(c, h, n // 2))
    log_dt = jnp.asarray(np.linspace(np.log(1e-3), np.log(1e-1), h), jnp.float32)
    return tile(lam), tile(p), tile(b), jnp.asarray(cc, jnp.complex64), log_dt


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / np.abs(b).max())


# c = 1 and 2 (4 and 6 sums: the kernel's specialised paths), 3 (8: the general one); lengths
# whose node counts (L/2 + 1) are not multiples of the kernel's 8 lanes.
@pytest.mark.parametrize("c,length", [(1, 64), (2, 200), (3, 50)])
def test_values_and_gradients_match_the_jnp_sums(c, length):
    h, n = 5, 16
    args = _args(h, n, c)
    w = jnp.asarray(np.random.default_rng(1).normal(size=(c, h, length)), jnp.float32)

    def grads(chunk):  # chunk=None: native on CPU; chunk=length: the dense jnp sums
        loss = lambda *a: jnp.sum(w * s4k.s4_kernel(*a, length, cauchy_chunk=chunk))  # noqa
        return jax.jit(jax.grad(loss, argnums=range(5)))(*args)

    native_k = jax.jit(lambda *a: s4k.s4_kernel(*a, length))(*args)
    assert "sptlib_s4_spectrum_fwd" in jax.jit(lambda *a: s4k.s4_kernel(*a, length)).lower(
        *args).as_text()
    assert _rel(native_k, s4k.s4_kernel(*args, length, cauchy_chunk=length)) < 1e-5
    for name, got, want in zip(("Lambda", "P", "B", "C", "log_dt"), grads(None), grads(length)):
        assert float(jnp.abs(want).max()) > 0, name
        for part in (jnp.real, jnp.imag) if jnp.iscomplexobj(want) else (jnp.real,):
            assert _rel(part(got), part(want)) < 1e-4, name


def test_native_sums_are_in_the_cpu_program_only():
    args = _args(3, 8, 1)
    f = jax.jit(lambda *a: s4k.s4_kernel(*a, 32))
    cpu = f.trace(*args).lower(lowering_platforms=("cpu",)).as_text()
    tpu = f.trace(*args).lower(lowering_platforms=("tpu",)).as_text()
    assert "sptlib_s4_spectrum_fwd" in cpu and "sptlib_s4_spectrum_fwd" not in tpu


def test_channels_sharded_on_a_4_device_mesh():
    """Each channel's sums are its own: channel shards run their own kernels (no all-gather) and
    give the single-device gradients."""
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from sptlib import kernels
        from sptlib.kernels import s4 as s4k
        h, n, L = 8, 16, 40
        lam, p, b, _ = kernels.nplr_legs(n)
        tile = lambda v: jnp.asarray(np.tile(v, (h, 1)), jnp.complex64)
        rng = np.random.default_rng(0)
        c = jnp.asarray(rng.normal(size=(1, h, n // 2)) + 1j * rng.normal(size=(1, h, n // 2)),
                        jnp.complex64)
        args = (tile(lam), tile(p), tile(b), c, jnp.full((h,), np.log(1e-2), jnp.float32))
        w = jnp.asarray(rng.normal(size=(1, h, L)), jnp.float32)
        loss = lambda *a: jnp.sum(w * s4k.s4_kernel(*a, L))
        f = jax.jit(jax.grad(loss, argnums=range(5)))
        ref = f(*args)
        mesh = Mesh(np.array(jax.devices()), ("m",))
        specs = (P("m"), P("m"), P("m"), P(None, "m"), P("m"))
        sharded = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, specs)]
        hlo = f.lower(*sharded).compile().as_text()
        assert "all-gather" not in hlo and "sptlib_s4_spectrum_bwd" in hlo
        for a, r in zip(f(*sharded), ref):
            np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-6 * float(jnp.abs(r).max()))
        print("ok")
    """)
    out = run_python(code, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
