"""Hyena (sptlib.layers.hyena) against a NumPy float64 forward built from its parameters with
the direct O(L^2) convolution (`sptlib.kernels.conv.direct_conv`), causal and bidirectional;
the Toeplitz reference path; padding; its positional features, decay window and state count."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.kernels import conv
from sptlib.layers import get_mixer
from sptlib.layers.hyena import HyenaMixer, decay_rates, positional_features

D, L = 6, 12
SMALL = dict(filter_order=8, emb_dim=5)


def _setup(causal, order=2):
    m = HyenaMixer(d_model=D, causal=causal, order=order, **SMALL)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, L, D))
    v = nn.meta.unbox(m.init(jax.random.PRNGKey(1), x))
    # Non-trivial skip and short-conv bias, so a dropped term shows.
    v = jax.tree_util.tree_map_with_path(
        lambda p, a: a + 0.3 if "short_b" in str(p) else a, v)
    return m, v, x


def _numpy_forward(m, v, x):
    """The paper's recurrence in float64 NumPy: z_{n+1} = x_n * (h_n * z_n + b_n z_n)."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), v["params"])
    x = np.asarray(x, np.float64)
    u = x @ p["in_proj"]["kernel"] + p["in_proj"]["bias"]
    w = np.asarray(p["short_w"])
    up = np.concatenate([np.zeros((u.shape[0], w.shape[0] - 1, u.shape[2])), u], axis=1)
    u = sum(w[i] * up[:, w.shape[0] - 1 - i: w.shape[0] - 1 - i + L] for i in range(w.shape[0]))
    u = u + p["short_b"]
    parts = np.split(u, m.order + 1, axis=-1)
    k = np.asarray(m.apply(v, L, method="filters"), np.float64)  # [n_dir, N, D, L]
    z = parts[0]
    for n in range(m.order):
        k_bwd = None if m.causal else k[1, n]
        z = parts[n + 1] * (conv.direct_conv(z, k[0, n], k_bwd=k_bwd) + p["bias"][n] * z)
    return z @ p["out_proj"]["kernel"] + p["out_proj"]["bias"]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("order", [1, 2, 3])
def test_fft_forward_equals_numpy_direct_convolution(causal, order):
    m, v, x = _setup(causal, order)
    y = np.asarray(m.apply(v, x))
    ref = _numpy_forward(m, v, x)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("causal", [True, False])
def test_toeplitz_reference_in_float64_equals_fft(causal):
    m, v, x = _setup(causal)
    y = m.apply(v, x)
    with jax.enable_x64(True):
        v64 = jax.tree.map(lambda a: a.astype(jnp.float64), v)
        y64 = m.apply(v64, x.astype(jnp.float64), method="direct")
        assert y64.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(y), np.asarray(y64), rtol=1e-4, atol=1e-5)


def test_causal_output_ignores_the_future_and_padding_content():
    m, v, x = _setup(True)
    x2 = x.at[:, 7:].set(5.0)
    np.testing.assert_allclose(m.apply(v, x)[:, :7], m.apply(v, x2)[:, :7], atol=1e-5)
    mb, vb, _ = _setup(False)
    mask = jnp.ones((2, L), bool).at[0, 9:].set(False).at[1, 2:4].set(False)
    junk = jnp.where(mask[..., None], x, 30.0)
    y, yj = mb.apply(vb, x, mask=mask), mb.apply(vb, junk, mask=mask)
    np.testing.assert_allclose(jnp.where(mask[..., None], y - yj, 0), 0, atol=1e-5)
    assert float(jnp.abs(jnp.where(mask[..., None], 0, y)).max()) == 0.0  # zero at padding


def test_positional_features_and_decay_by_hand():
    z = np.asarray(positional_features(4, 5))  # t, cos(f w) x 2, -sin(f w) x 2
    f = np.linspace(1e-4, 1, 2)
    w = 2 * math.pi * np.arange(4) / 4
    np.testing.assert_allclose(z[:, 0], np.linspace(0, 1, 4), atol=1e-7)
    np.testing.assert_allclose(z[:, 1:3], np.cos(w[:, None] * f), atol=1e-6)
    np.testing.assert_allclose(z[:, 3:5], -np.sin(w[:, None] * f), atol=1e-6)
    r = np.asarray(decay_rates(3))
    np.testing.assert_allclose(r, [math.log(100) / 1.5, (math.log(100) / 1.5 + math.log(100)
                                                         / 0.3) / 2, math.log(100) / 0.3],
                               rtol=1e-6)
    # The window: the filter of the fastest channel is 1e-2 of its unwindowed value by 30 %.
    assert math.exp(-r[-1] * 0.3) == pytest.approx(1e-2)


def test_registered_and_its_state_is_its_cache():
    assert get_mixer("hyena") is HyenaMixer
    m = HyenaMixer(d_model=D, causal=True)
    assert m.state_elements(100) == 2 * D * 100 + 2 * 3 * D
    with pytest.raises(ValueError, match="needs max_length"):
        m.state_elements()
    assert not hasattr(m, "step")  # no finite state: the conformance check runs no step rule


@pytest.mark.slow  # ~30-80 s on 2 loaded cores (the bfloat16 rule at L = 2048)
@pytest.mark.parametrize("causal", [True, False])
def test_hyena_passes_the_conformance_check_with_its_reference(causal):
    from sptlib.layers import contract
    contract.check_mixer(HyenaMixer, "hyena", 16, causal, tuple(sorted(SMALL.items())))
