"""The accelerator kernels behind the attention algorithms, against the plain jnp attention.

- TPU: Pallas splash attention in interpret mode (forward and gradients; full, causal, local
  band both ways, causal band; key padding; lengths that are not multiples of 128), its cost
  estimates, and that a step traced under a TPU mesh lowers to it (compiled for a v4 slice in
  tests/test_aot.py too).
- GPU: the cuDNN call's argument mapping for any key padding and for rows without a real key,
  checked through the same `jax.nn.dot_product_attention` call with `implementation="xla"` (no
  GPU here); the kernel choice; the Pallas band kernel lowering to Triton for CUDA (its values:
  tests/test_pallas_gpu_band.py).
- The choice itself: which kernel the dispatcher lowers per platform.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.slices import topologies
from sptlib.kernels import attention as ref
from sptlib.kernels import platform
from sptlib.kernels.platform import gpu, tpu


def _case(length, heads=2, head_dim=128, pad=13, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q, k, v = (jax.random.normal(kk, (2, length, heads, head_dim)) for kk in ks[:3])
    mask = jnp.arange(length)[None] < jnp.array([length, length - pad])[:, None]
    w = jax.random.normal(ks[3], q.shape) * mask[..., None, None]  # cotangent on real rows only
    return q * head_dim ** -0.5, k, v, mask, w


def _assert_equal_to_plain(fn, q, k, v, mask, w, causal, window, atol=2e-5, gatol=2e-4):
    plain = functools.partial(ref.dot_product_attention, causal=causal, window=window)
    real = np.asarray(mask)[..., None, None]
    out, expected = fn(q, k, v, mask), plain(q, k, v, mask)
    np.testing.assert_allclose(np.where(real, out, 0), np.where(real, expected, 0), atol=atol)
    loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v, mask) * w)
    got = jax.grad(loss(fn), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(plain), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(got, want):
        assert np.abs(np.asarray(b)).max() > 1e-2  # not trivially zero
        np.testing.assert_allclose(a, b, atol=gatol)
    # Padding keys get no gradient.
    for g in got[1:]:
        assert np.all(np.asarray(g)[1, -13:] == 0)


# ---------------------------------------------------------------------------------------------
# TPU: splash attention (Pallas, interpret mode on CPU)

SPLASH_CASES = [(256, False, 0), (200, True, 0), (300, False, 40), (130, True, 30)]


@pytest.mark.parametrize("length,causal,window", [
    SPLASH_CASES[0], SPLASH_CASES[1],
    *(pytest.param(*c, marks=pytest.mark.slow) for c in SPLASH_CASES[2:])])
def test_splash_equals_plain_forward_and_gradients(length, causal, window):
    q, k, v, mask, w = _case(length)
    fn = functools.partial(tpu.splash_attention, causal=causal, window=window, interpret=True)
    _assert_equal_to_plain(fn, q, k, v, mask, w, causal, window)


def test_splash_local_band_both_sides_and_odd_length():
    """One fast case of the band: a bidirectional window at a length splash pads (300 -> 384)."""
    q, k, v, mask, w = _case(300, heads=1)
    fn = functools.partial(tpu.splash_attention, window=40, interpret=True)
    _assert_equal_to_plain(fn, q, k, v, mask, w, False, 40)


def test_splash_past_512_pads_to_a_multiple_of_512():
    """Past one block, lengths pad to a multiple of 512 (520 -> 1024: two blocks, 1024-key
    backward blocks), still plain's function."""
    q, k, v, mask, w = _case(520, heads=1, pad=30)
    fn = functools.partial(tpu.splash_attention, causal=True, interpret=True)
    _assert_equal_to_plain(fn, q, k, v, mask, w, True, 0)


def test_splash_cost_estimate_of_a_full_mask_counts_the_grid():
    """A full mask (no mask function) computes every grid block. Forward: 4 head_dim FLOPs per
    (query, key) pair; the dkv kernel 8, or 10 fused (its results dq, dk, dv). Masks that empty
    blocks: tests/test_splash_costs.py."""
    grid, meta = (2, 4, 3), {"xprof_metadata": '{"block_q": 128, "block_kv": 128}'}
    q = jax.ShapeDtypeStruct((2, 512, 64), jnp.bfloat16)
    est = tpu.cost_estimate("splash_mha_fwd_segmented_no_residuals", grid, meta, [q, q, q], q)
    pairs = 2 * 4 * 3 * 128 * 128
    assert est.flops == 4 * 64 * pairs and est.transcendentals == pairs
    assert est.bytes_accessed == 4 * 2 * 512 * 64 * 2
    meta = {"xprof_metadata": '{"block_q_dkv": 256, "block_kv_dkv": 128}'}
    est = tpu.cost_estimate("splash_mha_dkv_segmented", grid, meta, [q, q, q], [q, q, q])
    assert est.flops == 10 * 64 * 2 * 4 * 3 * 256 * 128
    est = tpu.cost_estimate("splash_mha_dkv_segmented", grid, meta, [q, q, q], [None, q, q])
    assert est.flops == 8 * 64 * 2 * 4 * 3 * 256 * 128
    assert tpu.cost_estimate("some_other_kernel", grid, meta, [q], q) is None


def test_splash_seq_minor_layout_under_128_lanes_and_its_cost_reads_head_dim():
    """Heads narrower than 128 lanes go to splash sequence-minor (q `[heads, head_dim, length]`,
    not padded to 128 lanes in HBM); the cost estimate then reads head_dim from the
    second-to-last axis, not the length."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    seq_minor, head_minor = int(sk.QKVLayout.SEQ_MINOR), int(sk.QKVLayout.HEAD_DIM_MINOR)
    for head_dim, layout in ((32, seq_minor), (64, seq_minor), (128, head_minor)):
        kernel = tpu._kernel(1024, 2, head_dim, True, 0, True)
        assert int(kernel.kwargs["block_sizes"].q_layout) == layout, head_dim
    grid = (2, 4, 3)
    meta = {"xprof_metadata": f'{{"block_q": 128, "block_kv": 128, "q_layout": {seq_minor}}}'}
    q = jax.ShapeDtypeStruct((2, 32, 512), jnp.bfloat16)  # [heads, head_dim, length]
    est = tpu.cost_estimate("splash_mha_fwd_segmented_no_residuals", grid, meta, [q, q, q], q)
    assert est.flops == 4 * 32 * 2 * 4 * 3 * 128 * 128


def test_splash_compiles_for_a_v4_chip_with_a_cost():
    """Lowered for a TPU (libtpu's compile-only devices), every splash call is costed: the
    compiled program's FLOPs include the kernels' estimate and the step has a time bound."""
    spec = topologies.slice_spec("v4-8")
    devices = topologies.devices(spec)
    mesh = jax.sharding.Mesh(np.array(devices[:1]), ("data",))
    shape = jax.ShapeDtypeStruct((2, 1024, 4, 128), jnp.bfloat16,
                                 sharding=jax.sharding.NamedSharding(mesh, jax.P()))
    m = jax.ShapeDtypeStruct((2, 1024), jnp.bool_, sharding=shape.sharding)

    def loss(q, k, v, mask):
        return jnp.sum(platform.attention(q, k, v, mask).astype(jnp.float32))

    with jax.set_mesh(mesh):
        lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, shape, shape, m)
    assert "tpu_custom_call" in lowered.as_text()
    # sptlib.protocol.aot's effort: at 0 libtpu gives no time estimate.
    cost = lowered.compile({"exec_time_optimization_effort": -1.0}).cost_analysis()
    attention_flops = (4 + 10) * 2 * 4 * 1024 * 1024 * 128  # forward + fused backward, dense
    assert cost["flops"] >= attention_flops
    assert cost["optimal_seconds"] > 0


# ---------------------------------------------------------------------------------------------
# GPU: the cuDNN argument mapping and the kernel choice (the Pallas band kernel:
# tests/test_pallas_gpu_band.py)

def _scattered(mask):
    """`mask` with every third key of row 0 also padding (not only at the end of a row)."""
    return mask.at[0, ::3].set(False)


@pytest.mark.parametrize("causal,window,scatter", [(False, 0, False), (True, 0, False),
                                                   (True, 6, False), (False, 0, True),
                                                   (True, 6, True)])
def test_cudnn_call_maps_padding_causal_and_window(causal, window, scatter):
    """The cuDNN call's arguments (scale 1; key lengths for padding at the end of every row,
    else the key mask; a left window with the causal mask) give plain's function when XLA runs
    the same call, for any key padding."""
    q, k, v, mask, _ = _case(40, heads=2, head_dim=8, pad=9)
    mask = _scattered(mask) if scatter else mask
    out = gpu.cudnn_attention(q, k, v, mask, causal=causal, window=window, implementation="xla")
    expected = ref.dot_product_attention(q, k, v, mask, causal=causal, window=window)
    real = np.asarray(mask)[..., None, None]
    np.testing.assert_allclose(np.where(real, out, 0), np.where(real, expected, 0), atol=2e-6)


@pytest.mark.parametrize("causal,window", [(False, 0), (True, 0), (True, 2)])
def test_cudnn_rows_without_a_real_key_are_zero(causal, window):
    q, k, v, _, _ = _case(12, heads=2, head_dim=8)
    mask = jnp.array([[False] * 12, [False] * 5 + [True] * 7])  # row 0: no real key at all
    out = gpu.cudnn_attention(q, k, v, mask, causal=causal, window=window, implementation="xla")
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out[0], 0.0)
    # Row 1: queries before the first real key see none when causal.
    np.testing.assert_array_equal(out[1, :5] == 0, np.full((5, 2, 8), causal))
    expected = ref.dot_product_attention(q, k, v, mask, causal=causal, window=window)
    np.testing.assert_allclose(out[1, 5:], expected[1, 5:], atol=2e-6)
    grads = jax.grad(lambda q, k, v: gpu.cudnn_attention(
        q, k, v, mask, causal=causal, window=window, implementation="xla").sum(),
        argnums=(0, 1, 2))(q, k, v)
    assert all(np.all(np.isfinite(g)) for g in grads)


def test_gpu_kernel_choice():
    half = jnp.zeros((1, 8, 2, 64), jnp.bfloat16)
    choice = functools.partial(gpu.choice, gpu_vendor="cuda")
    assert choice(jnp.bfloat16, 64, causal=False, window=0) == "cudnn"
    assert choice(jnp.bfloat16, 64, causal=True, window=8) == "cudnn"
    assert choice(jnp.bfloat16, 64, causal=False, window=8) == "pallas"  # cuDNN: no right window
    assert choice(jnp.float32, 64, causal=False, window=0) == "pallas"  # cuDNN: half only
    assert choice(jnp.bfloat16, 12, causal=True, window=0) == "pallas"  # head size
    assert gpu.kernel_for(half, causal=True, window=0).func is gpu.cudnn_attention
    with pytest.warns(UserWarning, match="ROCm.*jnp reference"):
        gpu._warn_rocm.cache_clear()
        assert gpu.choice(jnp.bfloat16, 64, causal=False, window=0, gpu_vendor="rocm") is None


def test_gpu_pallas_kernel_lowers_to_triton_for_cuda():
    """The Pallas band kernel, forward and backward, lowers for CUDA to Triton calls on this
    CPU (compiling them to GPU code needs a GPU)."""
    x = jax.ShapeDtypeStruct((2, 300, 2, 32), jnp.bfloat16)
    m = jax.ShapeDtypeStruct((2, 300), jnp.bool_)
    fn = gpu.kernel_for(jnp.zeros((2, 300, 2, 32), jnp.bfloat16), causal=False, window=40)
    grad = jax.grad(lambda q, k, v, m: fn(q, k, v, m).astype(jnp.float32).sum(),
                    argnums=(0, 1, 2))
    text = jax.jit(grad).trace(x, x, x, m).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("__gpu$xla.gpu.triton") == 3  # forward, dK/dV, dQ


# ---------------------------------------------------------------------------------------------
# The dispatcher

def test_dispatch_lowers_the_tpu_kernel_only_for_a_tpu_mesh():
    q = jnp.zeros((4, 256, 2, 128), jnp.bfloat16)
    f = jax.jit(lambda q: platform.attention(q, q, q))
    assert "tpu_custom_call" not in f.lower(q).as_text()  # no mesh: this CPU, the CPU path
    devices = topologies.devices(topologies.slice_spec("v4-8"))
    mesh = jax.sharding.Mesh(np.array(devices).reshape(4), ("data",))
    s = jax.ShapeDtypeStruct(q.shape, q.dtype, sharding=jax.sharding.NamedSharding(
        mesh, jax.P("data")))
    with jax.set_mesh(mesh):
        text = f.lower(s).as_text()
    assert "tpu_custom_call" in text


def test_reference_kernel_and_bad_names():
    q, k, v, mask, _ = _case(24, head_dim=8)
    np.testing.assert_allclose(
        platform.attention(q, k, v, mask, algorithm="chunked", kernel="reference", chunk_size=8),
        ref.dot_product_attention(q, k, v, mask), atol=2e-6)
    with pytest.raises(ValueError, match="algorithm 'fused'"):
        platform.attention(q, k, v, mask, algorithm="fused")
    with pytest.raises(ValueError, match="kernel 'cudnn'"):
        platform.attention(q, k, v, mask, kernel="cudnn")


def test_target_platform_follows_the_mesh():
    assert platform.target_platform() == jax.default_backend()
    devices = topologies.devices(topologies.slice_spec("v4-8"))
    with jax.set_mesh(jax.sharding.Mesh(np.array(devices).reshape(4), ("data",))):
        assert platform.target_platform() == "tpu"
        assert not platform.cpu_kernels()  # nothing CPU-specific is traced for a TPU
