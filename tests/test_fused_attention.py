"""The fused XLA:CPU attention kernel (C++ via XLA FFI) against the float64 reference and plain."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.kernels import platform
from sptlib.kernels.platform.cpu import attention as fa
from sptlib.kernels.platform.cpu import build as native
from sptlib.layers.attention import MultiHeadAttention, dot_product_attention
from tests.test_attention import _qkv, reference_attention

# Skipped only where the machine has no C++ compiler at all: with one, a kernel that fails to build
# fails these tests (the fallback test below runs everywhere).
needs_kernel = pytest.mark.skipif(native._compiler() is None, reason="no C++ compiler")


def fused_attention(q, k, v, key_mask=None, **kw):
    """``plain`` attention as the platform chooses it on CPU: the C++ kernel."""
    return platform.attention(q, k, v, key_mask, algorithm="plain", **kw)


def run_python(code, **env):
    """Runs `code` in a fresh interpreter at the repository root with CPU JAX and `env` added."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu", **env))



@needs_kernel
def test_kernels_build_where_a_compiler_exists():
    """Otherwise every comparison below would compare the jnp fallback with itself."""
    assert platform.cpu_kernels(), platform.cpu_kernels_unavailable_reason()


def _case(length, heads, head_dim, seed=0):
    q, k, v, mask = _qkv(length=length, heads=heads, head_dim=head_dim, seed=seed)
    return q * head_dim ** -0.5, k, v, mask


# head_dim 16 / 32 / 64 take the vectorised paths, 24 and 12 the generic one; lengths that are
# and are not multiples of the kernel's 64-column and 8-row blocks.
@pytest.mark.parametrize("length,heads,head_dim", [(45, 3, 16), (64, 2, 32), (70, 2, 24),
                                                   (130, 1, 64), (33, 2, 12)])
@pytest.mark.parametrize("causal,window", [(False, 0), (True, 0), (False, 6), (True, 5)])
@needs_kernel
def test_forward_matches_reference(length, heads, head_dim, causal, window):
    q, k, v, mask = _case(length, heads, head_dim)
    out = jax.jit(lambda q, k, v, m: fused_attention(q, k, v, m, causal=causal,
                                                        window=window))(q, k, v, mask)
    ref = reference_attention(q, k, v, mask, causal, window)
    real = mask[..., None, None]
    np.testing.assert_allclose(np.where(real, out, 0), np.where(real, ref, 0), atol=2e-6)


@pytest.mark.parametrize("length,head_dim", [(45, 16), (70, 24), (64, 32)])
@pytest.mark.parametrize("causal,window", [(False, 0), (True, 0), (True, 7), (False, 6)])
@needs_kernel
def test_gradients_match_plain(length, head_dim, causal, window):
    """The kernel's backward equals autodiff of the jnp attention, padded keys get nothing."""
    q, k, v, mask = _case(length, 3, head_dim)
    mask = jnp.asarray(mask)
    w = jnp.asarray(np.random.default_rng(1).normal(size=q.shape).astype(np.float32))
    w = w * mask[..., None, None]
    loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v, mask, causal=causal, window=window) * w)
    plain = jax.grad(loss(dot_product_attention), argnums=(0, 1, 2))(q, k, v)
    fused = jax.jit(jax.grad(loss(fused_attention), argnums=(0, 1, 2)))(q, k, v)
    for a, b in zip(plain, fused):
        assert np.abs(np.asarray(a)).max() > 1e-2  # not trivially zero
        np.testing.assert_allclose(a, b, atol=1e-5)
    for g in fused[1:]:
        assert np.all(np.asarray(g)[0, 30:] == 0) and np.all(np.asarray(g)[1, 5:9] == 0)


@needs_kernel
def test_fully_masked_rows_equal_plain():
    """Queries that see no real key attend uniformly (plain's MASK_VALUE semantics), and their
    scores get no gradient: outputs and gradients equal plain's, cotangent on every row."""
    q, k, v, _ = _case(20, 2, 16)
    mask = jnp.asarray(np.arange(20)[None] >= np.array([[6], [0]]))  # row 0: queries 0..5 blind
    f = lambda fn: lambda q, k, v: jnp.sum(fn(q, k, v, mask, causal=True) ** 2)
    np.testing.assert_allclose(fused_attention(q, k, v, mask, causal=True),
                               dot_product_attention(q, k, v, mask, causal=True), atol=2e-6)
    for a, b in zip(jax.grad(f(dot_product_attention), argnums=(0, 1, 2))(q, k, v),
                    jax.grad(f(fused_attention), argnums=(0, 1, 2))(q, k, v)):
        np.testing.assert_allclose(a, b, atol=1e-5)


@needs_kernel
def test_no_mask_and_bfloat16_inputs():
    q, k, v, _ = _case(40, 2, 16)
    np.testing.assert_allclose(fused_attention(q, k, v), dot_product_attention(q, k, v),
                               atol=2e-6)
    qb, kb, vb = (jnp.asarray(a, jnp.bfloat16) for a in (q, k, v))
    out = fused_attention(qb, kb, vb)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.float32(out), dot_product_attention(
        *(np.float32(a) for a in (qb, kb, vb))), atol=2e-2)


@needs_kernel
def test_module_fused_equals_plain_with_grads():
    x = jnp.asarray(np.random.default_rng(3).normal(size=(2, 40, 32)).astype(np.float32))
    mask = jnp.asarray(np.arange(40)[None] < np.array([[40], [29]]))
    mk = lambda kernel: MultiHeadAttention(d_model=32, n_heads=2, positions="rotary",
                                           impl="plain", kernel=kernel)
    variables = mk("reference").init(jax.random.PRNGKey(0), x)
    loss = lambda kernel: lambda v: jnp.sum(mk(kernel).apply(v, x, mask=mask) ** 2)
    np.testing.assert_allclose(mk("auto").apply(variables, x, mask=mask),
                               mk("reference").apply(variables, x, mask=mask), atol=1e-5)
    ga, gb = jax.grad(loss("reference"))(variables), jax.grad(loss("auto"))(variables)
    for a, b in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
        np.testing.assert_allclose(a, b, atol=1e-4)


@needs_kernel
def test_other_platforms_lower_the_jnp_attention():
    """The same function lowered for TPU holds no custom call (`sptlib.aot` compiles it there)."""
    q, k, v, mask = _case(32, 2, 16)
    f = lambda q, k, v, m: fused_attention(q, k, v, m)
    cpu = jax.jit(f).trace(q, k, v, mask).lower(lowering_platforms=("cpu",)).as_text()
    tpu = jax.jit(f).trace(q, k, v, mask).lower(lowering_platforms=("tpu",)).as_text()
    assert fa._FWD in cpu and fa._FWD not in tpu


@needs_kernel
def test_compiles_into_a_fresh_cache_in_a_subprocess(tmp_path):
    """A new cache directory gets the library built once; a second process reuses it."""
    code = textwrap.dedent("""
        import jax.numpy as jnp
        from sptlib.kernels import platform
        assert platform.cpu_kernels(), platform.cpu_kernels_unavailable_reason()
        q = jnp.ones((1, 8, 1, 16))
        print(float(platform.attention(q, q, q).sum()))
    """)
    for _ in range(2):
        out = run_python(code, SPTLIB_KERNEL_CACHE=str(tmp_path))
        assert out.returncode == 0, out.stderr[-2000:]
        assert float(out.stdout.strip().splitlines()[-1]) == 128.0
    libs = [p for p in os.listdir(tmp_path) if p.endswith(".so")]
    assert len(libs) == 1 and libs[0].startswith("sptlib_kernels-")


def test_no_compiler_falls_back_to_jnp(tmp_path):
    code = textwrap.dedent("""
        import jax.numpy as jnp
        from sptlib.kernels import platform
        assert not platform.cpu_kernels()
        assert "compiler" in platform.cpu_kernels_unavailable_reason()
        q = jnp.ones((1, 8, 1, 16))
        print(float(platform.attention(q, q, q).sum()))
    """)
    out = run_python(code, SPTLIB_KERNEL_CACHE=str(tmp_path), CXX="/nonexistent/c++",
                     PATH="/nonexistent")
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip().splitlines()[-1]) == 128.0
    assert "native CPU kernels unavailable" in out.stderr


@needs_kernel
def test_sharded_batch_and_heads_run_per_shard_on_a_4_device_mesh():
    """Batch- and head-sharded operands: the kernels run per shard (no all-gather in the compiled
    program, gradients keep the operands' sharding) and equal the single-device jnp gradients."""
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        from sptlib.kernels import platform
        from sptlib.kernels.attention import dot_product_attention
        fused_attention = lambda q, k, v, m, **kw: platform.attention(q, k, v, m, **kw)
        assert len(jax.devices()) == 4
        rng = np.random.default_rng(0)
        q, k, v, w = (jnp.asarray(rng.normal(size=(4, 40, 2, 16)).astype(np.float32))
                      for _ in range(4))
        mask = jnp.asarray(np.arange(40)[None] < np.array([[40], [29], [33], [12]]))
        loss = lambda f: lambda q, k, v, m: jnp.sum(f(q, k, v, m, causal=True) * w)
        ref = jax.grad(loss(dot_product_attention), argnums=(0, 1, 2))(q, k, v, mask)
        mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"))
        for spec in (P("x"), P("x", None, "y"), P(None, None, "y")):
            args = [jax.device_put(a, NamedSharding(mesh, spec)) for a in (q, k, v)]
            args.append(jax.device_put(mask, NamedSharding(mesh, P(spec[0]))))
            f = jax.jit(jax.grad(loss(fused_attention), argnums=(0, 1, 2)))
            assert "all-gather" not in f.lower(*args).compile().as_text(), spec
            for a, b in zip(f(*args), ref):
                assert a.sharding.spec == spec, (spec, a.sharding.spec)
                np.testing.assert_allclose(a, b, atol=1e-5)
        print("ok")
    """)
    out = run_python(code, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_retired_backend_impl_names_its_replacement():
    """Configs that named the CPU backend (`impl="fused"`) get the algorithm to use instead."""
    x = jnp.ones((1, 8, 16))
    with pytest.raises(ValueError, match="impl='plain'"):
        MultiHeadAttention(d_model=16, n_heads=2, impl="fused").init(jax.random.PRNGKey(0), x)
