"""State-space sequence mixers (Flax Linen): S4, S4D, DSS, DLR, S5.

Each mixer is an S4 block (`sptlib.layers.ssm_block`, state-spaces/s4 `S4Block`):

    y = SSM(x) + D * x  ->  GELU  ->  Dropout  ->  Dense(2 * d_model)  ->  GLU

with `x, y: [batch, length, d_model]`, around one kernel module of `sptlib.layers.ssm_kernels`
(the SSM's parameters -> kernel and recurrence). The SSM is a long convolution with the kernel
`[n_dir, d_model, length]` (S4, S4D, DSS, DLR) or a parallel scan (S5). `causal=False` makes it
bidirectional: a second kernel (its own output matrix C, shared A, B, dt) runs on the reversed
sequence. Padded positions (`mask` False) are zeroed before the SSM, so they never reach real
positions.

Recurrent form (causal mixers): `initial_state(batch_size, max_length=None)` and
`step(x_t[batch, d_model], state) -> (y_t, state)`, through `module.apply(..., method=...)`.
The state is a dict of arrays with a leading batch axis: `x` (complex SSM state), and for S4 and
DSS-softmax `C`, the output matrix for `max_length` (their convolution kernels depend on the
sequence length; with `max_length=None` S4 uses the infinite-length limit C = C~).

Parameters keep their names in the mixer's scope (`A_re`, `B`, `C`, `log_dt`, ..., `D`,
`out_proj`); the "ssm" optimiser group (A / Lambda, dt, B, P, DLR's a and theta) is marked by the
kernel module that creates them (`sptlib.layers.param_groups`).
"""

import jax.numpy as jnp

from sptlib import kernels
from sptlib.layers.initializers import random_diagonal_inits
from sptlib.layers.param_groups import param_labels
from sptlib.layers.ssm_block import ConvSSM, SSMBlock
from sptlib.layers.ssm_kernels import (DLRKernel, DSSKernel, S4DKernel, S4Kernel,
                                       S5System)

# The "ssm" / "default" optimiser labels of a boxed parameter tree (by module, not by name).
ssm_param_labels = param_labels


class S4DMixer(ConvSSM):
    """S4D (Gu, Gupta, Goel & Re 2022) block, `S4DKernel`: diagonal A per channel.

    Fields: d_state (N, N/2 conjugate pairs), init_kind (lin | inv | legs | random; `init` is
    taken by Linen), discretization (zoh | bilinear).
    Parameters: A_re, A_im, B, log_dt [ssm]; C, D, out_proj [default].
    """
    init_kind: str = "lin"
    discretization: str = "zoh"
    n_ssm: int = 0  # tied copies of (A, B) (state-spaces/s4); 0 = one per channel

    @property
    def state_modes(self):
        return self.d_state // 2  # conjugate pairs: one of each is kept

    def _kernel_module(self, **common):
        return S4DKernel(init_kind=self.init_kind, discretization=self.discretization,
                         n_ssm=self.n_ssm, **common)


class DSSMixer(ConvSSM):
    """DSS (Gupta, Gu & Berant 2022) block, `DSSKernel`: Lambda `[N]` shared by the channels.

    Fields: d_state (N complex modes), version (exp | softmax), init_kind (legs | random).
    Parameters: Lambda_re, Lambda_im, log_dt [ssm]; W, D, out_proj [default].
    """
    version: str = "exp"
    init_kind: str = "legs"

    @property
    def state_modes(self):
        return self.d_state

    @property
    def _carries_c(self):
        return self.version == "softmax"

    def _kernel_module(self, **common):
        return DSSKernel(version=self.version, init_kind=self.init_kind, **common)


class DLRMixer(ConvSSM):
    """DLR (Gupta, Mehta & Berant 2022) block, `DLRKernel`: lambda = exp(-a^2 + i theta) shared
    by the channels, d_state = N complex modes (1024).

    Parameters: a, theta [ssm]; C [default; ssm with `c_in_ssm_group`], D, out_proj [default].
    """
    d_state: int = 1024
    c_in_ssm_group: bool = False
    theta_init: str = "uniform"  # uniform | omega (the paper code's init; DLRKernel)

    @property
    def state_modes(self):
        return self.d_state

    def _kernel_module(self, **common):
        return DLRKernel(c_in_ssm_group=self.c_in_ssm_group, theta_init=self.theta_init,
                         **common)


class S4Mixer(ConvSSM):
    """S4 (Gu, Goel & Re 2022) block, `S4Kernel`: DPLR A = Lambda - P P^* per channel with the
    NPLR HiPPO-LegS initialisation; its recurrence steps the full (non-diagonal) state.

    Parameters: A_re, A_im, P, B, log_dt [ssm]; C, D, out_proj [default]. `n_ssm`: tied copies
    of (A, P, B) (state-spaces/s4), 0 = one per channel.
    """
    n_ssm: int = 0

    @property
    def state_modes(self):
        return self.d_state

    @property
    def _carries_c(self):
        return True  # its output matrix depends on the length

    def _kernel_module(self, **common):
        return S4Kernel(n_ssm=self.n_ssm, **common)

    def _init_ssm_state(self, batch_size, max_length):
        c = self.ssm.output_matrix(max_length)
        return {"x": jnp.zeros((batch_size,) + c.shape, jnp.complex64),
                "C": jnp.broadcast_to(c, (batch_size,) + c.shape)}

    def _ssm_step(self, x_t, state):
        x = self.ssm.step(state["x"], x_t)
        return jnp.sum(state["C"] * x, axis=-1).real, dict(state, x=x)


class S5Mixer(SSMBlock):
    """S5 (Smith, Warrington & Linderman 2023) block, `S5System`: one MIMO diagonal SSM with
    state P = d_state over all channels, run by a parallel scan. Bidirectional: a second scan
    from the end with its own C.

    Fields: d_state, discretization (zoh | bilinear), init_kind (legs | random).
    Parameters: A_re, A_im, B, log_dt [ssm]; C, D, out_proj [default].
    """
    discretization: str = "zoh"
    init_kind: str = "legs"

    def _kernel_module(self, **common):
        return S5System(discretization=self.discretization, init_kind=self.init_kind, **common)

    def state_elements(self, max_length=None):
        """One MIMO state of d_state / 2 complex modes (conjugate pairs) per sequence."""
        del max_length
        return self.d_state

    def _ssm(self, x):
        dlam, db = self.ssm.discrete()
        bu = kernels.s5_input(db, x)
        c = self.ssm.output_matrices()
        y = kernels.s5_output(c[0], kernels.s5_scan(dlam, bu))
        if not self.causal:
            y = y + kernels.s5_output(c[1], kernels.s5_scan(dlam, bu, reverse=True))
        return y + self.D * x

    def _init_ssm_state(self, batch_size, max_length):
        return {"x": jnp.zeros((batch_size, self.d_state // 2), jnp.complex64)}

    def _ssm_step(self, x_t, state):
        dlam, db = self.ssm.discrete()
        x = dlam * state["x"] + kernels.s5_input(db, x_t)
        return kernels.s5_output(self.ssm.output_matrices()[0], x), {"x": x}


__all__ = ["S4Mixer", "S4DMixer", "DSSMixer", "DLRMixer", "S5Mixer", "ssm_param_labels",
           "random_diagonal_inits"]
