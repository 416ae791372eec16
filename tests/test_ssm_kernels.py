"""SSM kernel modules (sptlib.layers.ssm_kernels): each module's convolution kernel is the impulse
response of its own recurrence, and the blocks compose them without moving any parameter."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib import kernels
from sptlib.layers.gss import GSSBlock
from sptlib.layers.ssm import DLRMixer, DSSMixer, S4DMixer, S4Mixer, S5Mixer
from sptlib.layers.ssm_kernels import (DLRKernel, DSSKernel, GSSKernel, S4DKernel, S4Kernel,
                                       S5System)

H, N, L = 3, 8, 16
KEY = jax.random.PRNGKey(0)
DIAGONAL = {
    "s4d_zoh": (S4DKernel, {}),
    "s4d_bilinear_legs": (S4DKernel, dict(discretization="bilinear", init_kind="legs")),
    "s4d_random": (S4DKernel, dict(init_kind="random")),
    "dss_exp": (DSSKernel, {}),
    "dss_softmax_random": (DSSKernel, dict(version="softmax", init_kind="random")),
    "gss": (GSSKernel, {}),
    "dlr": (DLRKernel, {}),
}


def close(actual, reference):
    scale = float(np.max(np.abs(reference)))
    np.testing.assert_allclose(np.asarray(actual), np.asarray(reference), rtol=0,
                               atol=1e-4 * scale)
    assert scale > 0


@pytest.mark.parametrize("name", sorted(DIAGONAL))
def test_kernel_is_impulse_response_of_diag(name):
    cls, kw = DIAGONAL[name]
    mod = cls(channels=H, d_state=N, n_dir=2, **kw)
    v = mod.init(KEY, L, method="kernel")
    k = mod.apply(v, L, method="kernel")
    assert k.shape == (2, H, L) and k.dtype == jnp.float32
    dA, dB, c = mod.apply(v, L, method="diag")
    assert c.shape == (H, N // 2 if cls is S4DKernel else N)  # dA, dB broadcast to it
    # the recurrence stepped on a unit impulse (sptlib.kernels.impulse_response)
    close(k[0], kernels.impulse_response(dA, dB, c, L))


def test_s4_kernel_is_impulse_response_of_its_dplr_step():
    mod = S4Kernel(channels=H, d_state=N)
    v = mod.init(KEY, L, method="kernel")
    k = mod.apply(v, L, method="kernel")[0]
    c = mod.apply(v, L, method="output_matrix")  # [H, N]
    x = jnp.zeros((1, H, N), jnp.complex64)
    ys = []
    for t in range(L):
        x = mod.apply(v, x, jnp.full((1, H), 1.0 if t == 0 else 0.0), method="step")
        ys.append(jnp.sum(c * x[0], axis=-1).real)
    close(k, jnp.stack(ys, axis=-1))


def test_s5_system_shapes():
    mod = S5System(channels=H, d_state=N, n_dir=2)
    v = mod.init(KEY, method="discrete")
    dlam, db = mod.apply(v, method="discrete")
    assert dlam.shape == (N // 2,) and db.shape == (N // 2, H)
    assert mod.apply(v, method="output_matrices").shape == (2, H, N // 2)
    assert np.all(np.abs(np.asarray(dlam)) < 1)  # stable


BLOCKS = [
    (S4DMixer, S4DKernel, dict(d_state=N)),
    (DSSMixer, DSSKernel, dict(d_state=N)),
    (DLRMixer, DLRKernel, dict(d_state=N)),
    (S4Mixer, S4Kernel, dict(d_state=N)),
    (S5Mixer, S5System, dict(d_state=N)),
    (GSSBlock, GSSKernel, dict(d_state=N, expansion=2, d_ssm=H)),
]


@pytest.mark.parametrize("block_cls,kernel_cls,kw", BLOCKS,
                         ids=[b.__name__ for b, _, _ in BLOCKS])
def test_blocks_compose_the_kernel_module_in_their_own_scope(block_cls, kernel_cls, kw):
    """The block's SSM is the kernel module; its parameters sit at the block's top level with
    the values a standalone kernel module draws from the same key (they are created first)."""
    block = block_cls(d_model=H, causal=False, **kw)
    x = jnp.ones((1, L, H))
    params = block.init(KEY, x)["params"]
    ssm = block.bind({"params": params}).ssm
    assert type(ssm) is kernel_cls
    alone = kernel_cls(channels=ssm.channels, d_state=N, n_dir=2)
    if kernel_cls is S5System:
        alone_params = alone.init(KEY, method="discrete")["params"]
    else:
        alone_params = alone.init(KEY, L, method="kernel")["params"]
    assert "ssm" not in params and set(alone_params) < set(params)
    for name, value in alone_params.items():
        np.testing.assert_array_equal(np.asarray(value.unbox()), np.asarray(params[name].unbox()))


def test_gss_and_dss_share_the_dss_kernel():
    """GSS's kernel is the DSS kernel module with GSS's parameterisation: the same kernel and
    recurrence code, not a copy."""
    assert issubclass(GSSKernel, DSSKernel)
    assert GSSKernel.kernel is DSSKernel.kernel and GSSKernel.diag is DSSKernel.diag
