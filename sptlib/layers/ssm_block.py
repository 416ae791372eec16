"""The S4 block every state-space mixer of `sptlib.layers.ssm` shares (state-spaces/s4 `S4Block`):

    y = SSM(x) + D * x  ->  GELU  ->  Dropout  ->  Dense(2 * d_model)  ->  GLU

with `x, y: [batch, length, d_model]`. `SSMBlock` holds the block (D skip, GELU, dropout, GLU
out-projection) and the recurrent-form plumbing; the SSM itself is a kernel module of
`sptlib.layers.ssm_kernels` (its parameters in the block's scope, see `ssm_kernels.attach`),
made by the subclass's `_kernel_module`. `ConvSSM` runs it as a long convolution with
`kernel(length)` and steps its diagonal recurrence `diag(max_length)`.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from sptlib import kernels
from sptlib.layers.initializers import boxed
from sptlib.layers.initializers import dense as dense_init
from sptlib.layers.ssm_kernels import attach


class SSMBlock(nn.Module):
    """Shared S4 block: subclasses make the kernel module (`_kernel_module`) and run it (`_ssm`,
    `_init_ssm_state`, `_ssm_step`). Fields common to every mixer: d_model, causal, dropout,
    d_state, dt_min, dt_max, gelu_approximate (tanh GELU, faster on CPU), tie_dropout (one mask
    per example and channel, as state-spaces/s4's), dtype (of the output projection)."""
    d_model: int
    causal: bool = False
    dropout: float = 0.0
    d_state: int = 64
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    gelu_approximate: bool = True
    tie_dropout: bool = False  # one dropout mask per (example, channel), shared over positions
    init_scheme: str = "linen"  # of out_proj: linen | torch (sptlib.layers.initializers)
    dtype: Any = jnp.float32

    @property
    def n_dir(self):
        return 1 if self.causal else 2

    def setup(self):
        self.ssm = self._kernel_module(channels=self.d_model, d_state=self.d_state,
                                       n_dir=self.n_dir, dt_min=self.dt_min, dt_max=self.dt_max)
        attach(self, self.ssm)  # the SSM's parameters first, then D and out_proj, as always
        self.D = self.param("D", boxed(nn.initializers.normal(1.0), ("ssm_channels",)),
                            (self.d_model,), jnp.float32)
        kernel_init, bias_init = dense_init(self.init_scheme, self.d_model)
        self.out_proj = nn.Dense(
            2 * self.d_model, dtype=self.dtype,
            kernel_init=boxed(kernel_init, ("embed", "mlp")),
            bias_init=boxed(bias_init, ("mlp",)),
            name="out_proj")
        self.drop = nn.Dropout(self.dropout, broadcast_dims=(1,) if self.tie_dropout else ())

    # -- subclass interface ---------------------------------------------------------------------
    def _kernel_module(self, **common):
        """The `sptlib.layers.ssm_kernels` module of this mixer, from the `common` fields
        (channels, d_state, n_dir, dt_min, dt_max) and the mixer's own options."""
        raise NotImplementedError

    def _ssm(self, x):
        """[batch, length, H] float32 -> SSM output incl. D skip, float32."""
        raise NotImplementedError

    def _init_ssm_state(self, batch_size, max_length):
        raise NotImplementedError

    def _ssm_step(self, x_t, state):
        """x_t [batch, H] float32 -> (SSM output without D skip, state)."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------------
    def _post(self, y, deterministic):
        y = nn.gelu(y, approximate=self.gelu_approximate)
        y = self.drop(y, deterministic=deterministic)
        y = self.out_proj(y.astype(self.dtype))
        a, b = jnp.split(y, 2, axis=-1)
        return a * jax.nn.sigmoid(b)

    def __call__(self, x, *, mask=None, deterministic=True):
        """x `[batch, length, d_model]`, mask `[batch, length]` (True = real) -> same shape."""
        in_dtype = x.dtype
        x = x.astype(jnp.float32)
        if mask is not None:
            x = jnp.where(mask[..., None], x, 0.0)
        y = self._ssm(x)
        return self._post(y, deterministic).astype(in_dtype)

    def _require_causal(self):
        if not self.causal:
            raise ValueError(f"{type(self).__name__}: the step form needs causal=True")

    def initial_state(self, batch_size, max_length=None):
        """Zero recurrent state for `batch_size` sequences (of at most `max_length` steps)."""
        self._require_causal()
        return self._init_ssm_state(batch_size, max_length)

    # Complex modes of the recurrent state per channel (ConvSSM) or in all (S5): per mixer.
    state_modes = None

    def state_elements(self, max_length=None):
        """Real numbers of the recurrent state per sequence (`sptlib.layers.state`): the complex
        state, plus the output matrix C where it depends on the length (S4, DSS-softmax: the state
        carries it). Independent of `max_length`."""
        del max_length
        return 2 * self.d_model * self.state_modes * (2 if self._carries_c else 1)

    @property
    def _carries_c(self):
        return False

    def step(self, x_t, state):
        """One recurrent step: x_t `[batch, d_model]` -> (y_t `[batch, d_model]`, state)."""
        self._require_causal()
        in_dtype = x_t.dtype
        x_t = x_t.astype(jnp.float32)
        y, state = self._ssm_step(x_t, state)
        y = y + self.D * x_t
        return self._post(y, True).astype(in_dtype), state


class ConvSSM(SSMBlock):
    """A block whose SSM is a long convolution with the kernel module's `kernel(length) ->
    [n_dir, H, L]` and whose recurrence is its diagonal `diag(max_length) -> (dA, dB, C)`:
    x_t = dA x_{t-1} + dB u_t, y_t = Re sum_n C_n x_t,n."""

    def kernel(self, length):
        """`[n_dir, d_model, length]` convolution kernels (of the kernel module)."""
        return self.ssm.kernel(length)

    def _ssm(self, x):
        return kernels.ssm_conv(x, self.ssm.kernel(x.shape[1]), self.D, causal=self.causal)

    def _init_ssm_state(self, batch_size, max_length):
        _, _, c = self.ssm.diag(max_length)
        state = {"x": jnp.zeros((batch_size,) + c.shape, jnp.complex64)}
        if self.ssm.length_dependent_c:
            # the step does not know the length: the state carries the output matrix
            state["C"] = jnp.broadcast_to(c, (batch_size,) + c.shape)
        return state

    def _ssm_step(self, x_t, state):
        # (a length-dependent C comes from the state; the length passed here is then unused)
        dA, dB, c = self.ssm.diag(1)
        if self.ssm.length_dependent_c:
            c = state["C"]
        y, x = kernels.diagonal_step(state["x"], x_t, dA, dB, c)
        return y, dict(state, x=x)
