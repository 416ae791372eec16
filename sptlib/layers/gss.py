"""Gated State Space block (Mehta, Gupta, Cutkosky & Neyshabur, ICLR 2023, appendix A.2).

A whole residual block (its own shortcut and LayerNorm), following the paper's pseudocode:

    shortcut, x = x, LayerNorm(x)
    v = GELU(Dense_F(x))                       # [batch, length, F]
    u = GELU(Dense_H(x))                       # [batch, length, H]
    y = DSS(u) = conv(LayerNorm(u), K) + D * LayerNorm(u)
    out = Dense_E(Dense_F(y) * v) + shortcut   # [batch, length, E]

with the simplified DSS kernel K_k = Re sum_n C_n (exp(lambda_n) - 1)/lambda_n exp(k lambda_n)
(dt fixed to 1), lambda = -exp(Lambda_re) + i exp(Lambda_im) shared by the H channels,
N = d_state complex modes: `sptlib.layers.ssm_kernels.GSSKernel`, the DSS kernel module with
GSS's parameterisation and initial ranges. F = expansion * E, H = d_ssm (0 -> E // 4).
Lambda_re and Lambda_im are the "ssm" parameters (lr 1e-3, no weight decay, as in the paper);
C, D and the dense layers are "default".

Same call contract as the mixers: `block(x[batch, length, E], *, mask, deterministic)`;
`causal=False` adds a second kernel (its own C) on the reversed sequence. Causal blocks offer
`initial_state` / `step`.
"""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from sptlib import kernels
from sptlib.layers.initializers import boxed
from sptlib.layers.ssm_kernels import GSSKernel, attach


class GSSBlock(nn.Module):
    """GSS residual block: `[batch, length, d_model] -> [batch, length, d_model]`."""
    d_model: int
    causal: bool = False
    dropout: float = 0.0
    d_state: int = 512
    expansion: int = 4
    d_ssm: int = 0
    gelu_approximate: bool = True
    dtype: Any = jnp.float32

    @property
    def _h(self):
        return self.d_ssm or max(1, self.d_model // 4)

    def setup(self):
        e, f, h, n = self.d_model, self.expansion * self.d_model, self._h, self.d_state
        init = nn.initializers.lecun_normal()
        zeros = nn.initializers.zeros

        def dense(features, names, name):
            return nn.Dense(features, dtype=self.dtype, kernel_init=boxed(init, names),
                            bias_init=boxed(zeros, names[-1:]), name=name)

        def ln(name):
            return nn.LayerNorm(dtype=jnp.float32, name=name,
                                scale_init=boxed(nn.initializers.ones, ("norm",)),
                                bias_init=boxed(zeros, ("norm",)))

        self.norm = ln("norm")
        self.dense_v = dense(f, ("embed", "mlp"), "dense_v")
        self.dense_u = dense(h, ("embed", "ssm_channels"), "dense_u")
        self.dense_y = dense(f, (None, "mlp"), "dense_y")
        self.dense_o = dense(e, ("mlp", "embed"), "dense_o")
        self.ssm_norm = ln("ssm_norm")
        self.ssm = GSSKernel(channels=h, d_state=n, n_dir=1 if self.causal else 2)
        attach(self, self.ssm)  # its parameters before D, as when the block created them
        self.D = self.param("D", boxed(nn.initializers.ones, ("ssm_channels",)), (h,),
                            jnp.float32)
        self.drop = nn.Dropout(self.dropout)

    def kernel(self, length):
        """`[n_dir, H, length]` simplified DSS kernels."""
        return self.ssm.kernel(length)

    def _gelu(self, x):
        return nn.gelu(x, approximate=self.gelu_approximate)

    def _pre(self, x):
        h = self.norm(x)
        v = self._gelu(self.dense_v(h.astype(self.dtype)))
        u = self._gelu(self.dense_u(h.astype(self.dtype)))
        return v, self.ssm_norm(u.astype(jnp.float32))

    def _post(self, y, v, shortcut, deterministic):
        o = self.dense_o(self.dense_y(y.astype(self.dtype)) * v)
        o = self.drop(o, deterministic=deterministic)
        return (o + shortcut).astype(shortcut.dtype)

    def __call__(self, x, *, mask=None, deterministic=True):
        """x `[batch, length, d_model]`, mask `[batch, length]` (True = real) -> same shape."""
        v, u = self._pre(x)
        if mask is not None:
            u = jnp.where(mask[..., None], u, 0.0)  # pads never reach the convolution
        y = kernels.ssm_conv(u, self.ssm.kernel(x.shape[1]), self.D, causal=self.causal)
        return self._post(y, v, x, deterministic)

    def _require_causal(self):
        if not self.causal:
            raise ValueError("GSSBlock: the step form needs causal=True")

    def initial_state(self, batch_size, max_length=None):
        """Zero DSS state `{'x': complex [batch, H, N]}`."""
        self._require_causal()
        return {"x": jnp.zeros((batch_size, self._h, self.d_state), jnp.complex64)}

    def state_elements(self, max_length=None):
        """Real numbers of the DSS state per sequence: H x N complex (`sptlib.layers.state`)."""
        del max_length
        return 2 * self._h * self.d_state

    def step(self, x_t, state):
        """x_t `[batch, d_model]` -> (y_t `[batch, d_model]`, state)."""
        self._require_causal()
        v, u = self._pre(x_t)
        dA, dB, c = self.ssm.diag(None)
        y, x = kernels.diagonal_step(state["x"], u, dA, dB, c)
        return self._post(y + self.D * u, v, x_t, True), {"x": x}
