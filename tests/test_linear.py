"""Dense products with the native CPU weight gradient (`sptlib.kernels.linear`) against float64
NumPy and jnp autodiff."""

import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.kernels import linear
from sptlib.kernels.platform.cpu import build as native
from tests.test_fused_attention import run_python

# Skipped only where the machine has no C++ compiler (then the jnp products run everywhere).
pytestmark = pytest.mark.skipif(native._compiler() is None, reason="no C++ compiler")


def _arrays(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.normal(size=s).astype(np.float32)) for s in shapes]


# Token counts that are and are not multiples of the kernel's 16-token blocks and 256-token
# chunks (and above its 32-chunk cap: 9,000 tokens); k not a multiple of the 8-row tiles.
@pytest.mark.parametrize("lead,k,n", [((3, 37), 12, 16), ((2, 256), 64, 64), ((9000,), 64, 128),
                                      ((5, 7, 3), 2, 8), ((4, 64), 130, 24)])
def test_matmul_gradients_match_float64(lead, k, n):
    x, w, g = _arrays((*lead, k), (k, n), (*lead, n))
    assert linear._cpu_kernel_ok(x, k, n)
    y, vjp = jax.vjp(jax.jit(linear.matmul), x, w)
    dx, dw = jax.jit(vjp)(g)
    x64, w64, g64 = (np.asarray(a, np.float64) for a in (x, w, g))
    np.testing.assert_allclose(y, x64 @ w64, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dx, g64 @ w64.T, rtol=1e-5, atol=1e-4)
    want = x64.reshape(-1, k).T @ g64.reshape(-1, n)
    np.testing.assert_allclose(dw, want, rtol=1e-5, atol=2e-5 * np.sqrt(x64.size / k))


def test_project_is_tensordot_in_value_and_gradient():
    """Attention's projections: `[..., d] x [d, h, k]` and `[..., h, k] x [h, k, d]`."""
    x, w_in, o, w_out = _arrays((2, 33, 64), (64, 4, 16), (2, 33, 4, 16), (4, 16, 64))
    for a, w, n_in in ((x, w_in, 1), (o, w_out, 2)):
        loss = lambda f: lambda a, w: jnp.sum(jnp.sin(f(a, w)))
        got = jax.jit(jax.value_and_grad(loss(lambda a, w: linear.project(a, w, n_in)),
                                         argnums=(0, 1)))(a, w)
        want = jax.value_and_grad(loss(lambda a, w: jnp.tensordot(a, w, n_in)),
                                  argnums=(0, 1))(a, w)
        for u, v in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(u, v, rtol=2e-5, atol=2e-5)


def test_dense_with_linear_dot_general_keeps_parameters_and_gradients():
    x, = _arrays((4, 50, 64))
    plain, ours = nn.Dense(128), nn.Dense(128, dot_general=linear.dot_general)
    params = plain.init(jax.random.PRNGKey(0), x)
    assert jax.tree.structure(ours.init(jax.random.PRNGKey(0), x)) == jax.tree.structure(params)
    loss = lambda m: lambda p: jnp.sum(jnp.tanh(m.apply(p, x)))
    got, want = jax.jit(jax.grad(loss(ours)))(params), jax.grad(loss(plain))(params)
    for u, v in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(u, v, rtol=2e-5, atol=2e-5)


def test_other_shapes_and_dtypes_use_the_jnp_product():
    x, w = _arrays((3, 64), (64, 12))
    assert not linear._cpu_kernel_ok(x, 64, 12)  # n not a multiple of 8
    assert not linear._cpu_kernel_ok(x.astype(jnp.bfloat16), 64, 16)
    assert not linear._cpu_kernel_ok(x, 1024, 1024)  # large weights: XLA's dot splits well
    f = jax.jit(jax.grad(lambda x, w: jnp.sum(linear.matmul(x, w) ** 2), argnums=1))
    assert "sptlib_weight_grad" not in f.lower(x, w).as_text()
    y = linear.dot_general(x, w, (((1,), (0,)), ((), ())), precision=jax.lax.Precision.HIGHEST)
    np.testing.assert_allclose(y, np.asarray(x, np.float64) @ np.asarray(w, np.float64),
                               rtol=1e-5, atol=1e-5)


def test_native_kernel_is_in_the_cpu_program_only():
    x, w = _arrays((8, 64), (64, 32))
    f = jax.jit(jax.grad(lambda x, w: jnp.sum(linear.matmul(x, w) ** 2), argnums=1))
    cpu = f.trace(x, w).lower(lowering_platforms=("cpu",)).as_text()
    tpu = f.trace(x, w).lower(lowering_platforms=("tpu",)).as_text()
    assert "sptlib_weight_grad" in cpu and "sptlib_weight_grad" not in tpu


def test_token_sharded_weight_gradient_on_a_4_device_mesh():
    """Each shard computes its partial xᵀ g; the partials are summed over the token axis."""
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from sptlib.kernels import linear
        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.normal(size=(8, 40, 64)).astype(np.float32))
        w = jnp.asarray(rng.normal(size=(64, 32)).astype(np.float32))
        loss = lambda x, w: jnp.sum(jnp.tanh(linear.matmul(x, w)))
        ref = jax.grad(loss, argnums=(0, 1))(x, w)
        mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"))
        for spec in (P("x"), P(("x", "y"))):
            args = (jax.device_put(x, NamedSharding(mesh, spec)),
                    jax.device_put(w, NamedSharding(mesh, P())))
            f = jax.jit(jax.grad(loss, argnums=(0, 1)))
            hlo = f.lower(*args).compile().as_text()
            assert "all-gather" not in hlo and "sptlib_weight_grad" in hlo, spec
            for a, b in zip(f(*args), ref):
                np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
        print("ok")
    """)
    out = run_python(code, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
