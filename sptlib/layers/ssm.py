"""State-space sequence mixers (Flax Linen): S4, S4D, DSS, DLR, S5.

Each mixer is an S4 block (state-spaces/s4 `S4Block`):

    y = SSM(x) + D * x  ->  GELU  ->  Dropout  ->  Dense(2 * d_model)  ->  GLU

with `x, y: [batch, length, d_model]`. The SSM is a long convolution with a kernel computed from
the layer's parameters (S4, S4D, DSS, DLR; `sptlib.kernels`) or a parallel scan (S5).
`causal=False` makes it bidirectional: a second kernel (its own output matrix C, shared A, B, dt)
runs on the reversed sequence. Padded positions (`mask` False) are zeroed before the SSM, so they
never reach real positions.

Recurrent form (causal mixers): `initial_state(batch_size, max_length=None)` and
`step(x_t[batch, d_model], state) -> (y_t, state)`, through `module.apply(..., method=...)`.
The state is a dict of arrays with a leading batch axis: `x` (complex SSM state), and for S4 and
DSS-softmax `C`, the output matrix for `max_length` (their convolution kernels depend on the
sequence length; with `max_length=None` S4 uses the infinite-length limit C = C~).

Complex parameters are stored as real arrays with a trailing (re, im) axis of size 2. The
parameters that take the SSM learning rate and no weight decay (A / Lambda, dt, B, P, DLR's a and
theta) are created in the "ssm" optimiser group (`sptlib.layers.param_groups`; the block itself
is `sptlib.layers.ssm_block`, the initialisers `sptlib.layers.initializers`).
"""


import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sptlib import kernels
from sptlib.layers.initializers import (complex_normal, const, log_uniform, negated_exp,
                                        random_diagonal_inits, real_pair)
from sptlib.layers.param_groups import param_labels
from sptlib.layers.ssm_block import ConvSSM, SSMBlock, as_complex

# The "ssm" / "default" optimiser labels of a boxed parameter tree (by module, not by name).
ssm_param_labels = param_labels


# ----------------------------------------------------------------------------------------------
# S4D
# ----------------------------------------------------------------------------------------------

class S4DMixer(ConvSSM):
    """S4D (Gu, Gupta, Goel & Re 2022): diagonal A per channel, N/2 conjugate pairs.

    K_k = 2 Re sum_n C_n B_n (exp(dt A_n) - 1)/A_n exp(k dt A_n) (ZOH; bilinear optional).
    Fields: d_state (N), init_kind (lin | inv | legs | random; `init` is taken by Linen; random
    is the unstructured control, see `random_diagonal_inits`), discretization (zoh |
    bilinear).
    Parameters: A_re (log of -Re A), A_im, B, log_dt [ssm]; C, D, out_proj [default].
    """
    init_kind: str = "lin"
    discretization: str = "zoh"

    def _setup_ssm(self):
        h, n2 = self.d_model, self.d_state // 2
        ax = ("ssm_channels", "ssm_state")
        if self.init_kind == "random":
            # Unstructured control: every channel draws its own A and B from the init key.
            a_re, a_im, b = random_diagonal_inits(n2)
            self.A_re = self._ssm_p("A_re", a_re, (h, n2), ax)
            self.A_im = self._ssm_p("A_im", a_im, (h, n2), ax)
            self.B = self._ssm_p("B", b, (h, n2, 2), ax + (None,))
        else:
            a, b = kernels.s4d_init(self.d_state, self.init_kind)
            self.A_re = self._ssm_p("A_re", const(np.tile(np.log(-a.real), (h, 1))), (h, n2), ax)
            self.A_im = self._ssm_p("A_im", const(np.tile(a.imag, (h, 1))), (h, n2), ax)
            self.B = self._ssm_p("B", const(np.tile(real_pair(b), (h, 1, 1))), (h, n2, 2),
                                 ax + (None,))
        self.C = self._p("C", complex_normal(1.0), (self.n_dir, h, n2, 2),
                         (None,) + ax + (None,))
        self.log_dt = self._ssm_p("log_dt", log_uniform(self.dt_min, self.dt_max), (h,),
                                  ("ssm_channels",))

    def _A(self):
        return jax.lax.complex(-jnp.exp(self.A_re), self.A_im)

    def kernel(self, length):
        return kernels.s4d_kernel(self._A(), as_complex(self.B), as_complex(self.C), self.log_dt,
                                  length, self.discretization)

    def _diag(self, max_length):
        dA, dB = kernels.s4d_discretize(self._A(), as_complex(self.B), self.log_dt,
                                        self.discretization)
        return dA, dB, 2 * as_complex(self.C[0])


# ----------------------------------------------------------------------------------------------
# DSS
# ----------------------------------------------------------------------------------------------

class DSSMixer(ConvSSM):
    """DSS (Gupta, Gu & Berant 2022): Lambda `[N]` shared by the channels, W `[H, N]`, dt `[H]`.

    version exp: Re lambda = -exp(Lambda_re); softmax: lambda = Lambda_re + i Lambda_im,
    normalised over the length (see `sptlib.kernels.dss_kernel`). d_state = N complex modes.
    Initialised from the normal part of HiPPO-LegS (-1/2 + i w). Parameters: Lambda_re,
    Lambda_im, log_dt [ssm]; W, D, out_proj [default].
    """
    version: str = "exp"
    init_kind: str = "legs"  # legs | random (the unstructured control)

    @property
    def _length_dependent_c(self):
        return self.version == "softmax"

    def _setup_ssm(self):
        h, n = self.d_model, self.d_state
        if self.init_kind == "random":
            a_re, a_im, _ = random_diagonal_inits(n)
            if self.version != "exp":
                a_re = negated_exp(a_re)
            self.Lambda_re = self._ssm_p("Lambda_re", a_re, (n,), ("ssm_state",))
            self.Lambda_im = self._ssm_p("Lambda_im", a_im, (n,), ("ssm_state",))
        elif self.init_kind == "legs":
            lam, _, _, _ = kernels.nplr_legs(2 * n)
            re = np.log(-lam.real) if self.version == "exp" else lam.real
            self.Lambda_re = self._ssm_p("Lambda_re", const(re), (n,), ("ssm_state",))
            self.Lambda_im = self._ssm_p("Lambda_im", const(lam.imag), (n,), ("ssm_state",))
        else:
            raise ValueError(f"DSS init_kind must be legs | random, got {self.init_kind!r}")
        self.W = self._p("W", complex_normal(1.0), (self.n_dir, h, n, 2),
                         (None, "ssm_channels", "ssm_state", None))
        self.log_dt = self._ssm_p("log_dt", log_uniform(self.dt_min, self.dt_max), (h,),
                                  ("ssm_channels",))

    def _lambda(self):
        re = -jnp.exp(self.Lambda_re) if self.version == "exp" else self.Lambda_re
        return jax.lax.complex(re, self.Lambda_im)

    def kernel(self, length):
        return kernels.dss_kernel(self._lambda(), as_complex(self.W), self.log_dt, length,
                                  self.version)

    def _diag(self, max_length):
        if self.version == "softmax" and max_length is None:
            raise ValueError("DSS-softmax: initial_state needs max_length (its kernel is "
                             "normalised over the sequence length)")
        return kernels.dss_discretize(self._lambda(), as_complex(self.W[0]), self.log_dt,
                                      max_length or None, self.version)


# ----------------------------------------------------------------------------------------------
# DLR
# ----------------------------------------------------------------------------------------------

class DLRMixer(ConvSSM):
    """DLR (Gupta, Mehta & Berant 2022): x_k = Lambda x_{k-1} + u_k, y_k = Re(C x_k),
    lambda = exp(-a^2 + i theta) shared by the channels, d_state = N complex modes (1024).

    Init: a^2 log-uniform in [1e-4, 1e-1] (|lambda| in [0.90, 0.9999]), theta uniform in
    [0, 2 pi), C complex normal with E|C|^2 = 1/N. Parameters: a, theta [ssm]; C, D, out_proj
    [default].
    """
    d_state: int = 1024

    def _setup_ssm(self):
        h, n = self.d_model, self.d_state

        def a_init(key, shape, dtype=jnp.float32):
            return jnp.sqrt(jnp.exp(log_uniform(1e-4, 1e-1)(key, shape, dtype)))

        def theta_init(key, shape, dtype=jnp.float32):
            return jax.random.uniform(key, shape, dtype, 0.0, 2 * np.pi)

        self.a = self._ssm_p("a", a_init, (n,), ("ssm_state",))
        self.theta = self._ssm_p("theta", theta_init, (n,), ("ssm_state",))
        self.C = self._p("C", complex_normal(1.0 / np.sqrt(n)), (self.n_dir, h, n, 2),
                         (None, "ssm_channels", "ssm_state", None))

    def kernel(self, length):
        log_lambda = kernels.dlr_log_lambda(self.a, self.theta)
        return kernels.dlr_kernel(log_lambda, as_complex(self.C), length)

    def _diag(self, max_length):
        dA = jnp.exp(kernels.dlr_log_lambda(self.a, self.theta))
        return dA, jnp.ones_like(dA), as_complex(self.C[0])


# ----------------------------------------------------------------------------------------------
# S4 (DPLR)
# ----------------------------------------------------------------------------------------------

class S4Mixer(ConvSSM):
    """S4 (Gu, Goel & Re 2022) with the NPLR HiPPO-LegS initialisation: A = Lambda - P P^* per
    channel (rank 1), bilinear discretisation, kernel by Cauchy + Woodbury at the roots of unity.

    C is the "C tilde" of the paper (see `sptlib.kernels.s4`). Parameters: A_re (log of
    -Re Lambda), A_im, P, B, log_dt [ssm]; C, D, out_proj [default].
    """
    _length_dependent_c = True

    def _setup_ssm(self):
        h, n2 = self.d_model, self.d_state // 2
        lam, p, b, _ = kernels.nplr_legs(self.d_state)
        ax = ("ssm_channels", "ssm_state")
        tile = lambda v: np.tile(v, (h,) + (1,) * np.ndim(v))  # noqa: E731
        self.A_re = self._ssm_p("A_re", const(tile(np.log(-lam.real))), (h, n2), ax)
        self.A_im = self._ssm_p("A_im", const(tile(lam.imag)), (h, n2), ax)
        self.P = self._ssm_p("P", const(tile(real_pair(p))), (h, n2, 2), ax + (None,))
        self.B = self._ssm_p("B", const(tile(real_pair(b))), (h, n2, 2), ax + (None,))
        self.C = self._p("C", complex_normal(1.0), (self.n_dir, h, n2, 2),
                         (None,) + ax + (None,))
        self.log_dt = self._ssm_p("log_dt", log_uniform(self.dt_min, self.dt_max), (h,),
                                  ("ssm_channels",))

    def _lambda(self):
        return jax.lax.complex(-jnp.exp(self.A_re), self.A_im)

    def kernel(self, length):
        return kernels.s4_kernel(self._lambda(), as_complex(self.P), as_complex(self.B),
                                 as_complex(self.C), self.log_dt, length)

    def _init_ssm_state(self, batch_size, max_length):
        c = kernels.s4_output_matrix(self._lambda(), as_complex(self.P), as_complex(self.B),
                                     as_complex(self.C[0]), self.log_dt, max_length)
        c = c.astype(jnp.complex64)
        return {"x": jnp.zeros((batch_size,) + c.shape, jnp.complex64),
                "C": jnp.broadcast_to(c, (batch_size,) + c.shape)}

    def _ssm_step(self, x_t, state):
        x = kernels.s4_step(state["x"], x_t, self._lambda(), as_complex(self.P),
                            as_complex(self.B), self.log_dt)
        return jnp.sum(state["C"] * x, axis=-1).real, dict(state, x=x)


# ----------------------------------------------------------------------------------------------
# S5
# ----------------------------------------------------------------------------------------------

class S5Mixer(SSMBlock):
    """S5 (Smith, Warrington & Linderman 2023): one MIMO diagonal SSM with state P = d_state
    (P/2 conjugate pairs) over all channels, run by a parallel scan; per-state dt.

    Init (init_kind legs): Lambda = eigenvalues of the normal part of HiPPO-LegS, B = V^* B0,
    C = C0 V with B0, C0 random (V its eigenvectors); init_kind random: the unstructured control
    (`random_diagonal_inits` for Lambda, complex normal B and C). Bidirectional: a second scan
    from the end with its own C.
    Parameters: A_re (log of -Re Lambda), A_im, B, log_dt [ssm]; C, D, out_proj [default].
    """
    discretization: str = "zoh"
    init_kind: str = "legs"  # legs | random (the unstructured control)

    def _setup_ssm(self):
        h, p = self.d_model, self.d_state
        n2 = p // 2
        if self.init_kind == "random":
            # Unstructured control: random diagonal Lambda, B and C without an eigenbasis.
            a_re, a_im, _ = random_diagonal_inits(n2)
            self.A_re = self._ssm_p("A_re", a_re, (n2,), ("ssm_state",))
            self.A_im = self._ssm_p("A_im", a_im, (n2,), ("ssm_state",))
            self.B = self._ssm_p("B", complex_normal(1.0 / np.sqrt(h)), (n2, h, 2),
                                 ("ssm_state", "ssm_channels", None))
            self.C = self._p("C", complex_normal(1.0 / np.sqrt(n2)), (self.n_dir, h, n2, 2),
                             (None, "ssm_channels", "ssm_state", None))
            self.log_dt = self._ssm_p("log_dt", log_uniform(self.dt_min, self.dt_max), (n2,),
                                      ("ssm_state",))
            return
        if self.init_kind != "legs":
            raise ValueError(f"S5 init_kind must be legs | random, got {self.init_kind!r}")
        lam, _, _, v = kernels.nplr_legs(p)
        self.A_re = self._ssm_p("A_re", const(np.log(-lam.real)), (n2,), ("ssm_state",))
        self.A_im = self._ssm_p("A_im", const(lam.imag), (n2,), ("ssm_state",))
        vh = v.conj().T  # [P/2, P]

        vh = jnp.asarray(vh, jnp.complex64)
        v = jnp.asarray(v, jnp.complex64)

        def b_init(key, shape, dtype=jnp.float32):
            b = vh @ nn.initializers.lecun_normal()(key, (p, h), jnp.float32)
            return jnp.stack([b.real, b.imag], axis=-1).astype(dtype)

        def c_init(key, shape, dtype=jnp.float32):
            c = (jax.random.normal(key, (shape[0], h, p)) / np.sqrt(p)) @ v
            return jnp.stack([c.real, c.imag], axis=-1).astype(dtype)

        self.B = self._ssm_p("B", b_init, (n2, h, 2), ("ssm_state", "ssm_channels", None))
        self.C = self._p("C", c_init, (self.n_dir, h, n2, 2),
                         (None, "ssm_channels", "ssm_state", None))
        self.log_dt = self._ssm_p("log_dt", log_uniform(self.dt_min, self.dt_max), (n2,),
                                  ("ssm_state",))

    def _discrete(self):
        lam = jax.lax.complex(-jnp.exp(self.A_re), self.A_im)
        return kernels.s5_discretize(lam, as_complex(self.B), self.log_dt, self.discretization)

    def _ssm(self, x):
        dlam, db = self._discrete()
        bu = kernels.s5_input(db, x)
        c = as_complex(self.C)
        y = kernels.s5_output(c[0], kernels.s5_scan(dlam, bu))
        if not self.causal:
            y = y + kernels.s5_output(c[1], kernels.s5_scan(dlam, bu, reverse=True))
        return y + self.D * x

    def _init_ssm_state(self, batch_size, max_length):
        return {"x": jnp.zeros((batch_size, self.d_state // 2), jnp.complex64)}

    def _ssm_step(self, x_t, state):
        dlam, db = self._discrete()
        x = dlam * state["x"] + kernels.s5_input(db, x_t)
        return kernels.s5_output(as_complex(self.C[0]), x), {"x": x}


__all__ = ["S4Mixer", "S4DMixer", "DSSMixer", "DLRMixer", "S5Mixer", "ssm_param_labels",
           "random_diagonal_inits"]
