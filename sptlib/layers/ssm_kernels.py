"""SSM kernel modules (Flax Linen): one SSM's parameters -> its convolution kernel and recurrence.

Each module holds the parameters of one state-space model over `channels` (H) channels and
computes, with N = `d_state` and n_dir = 1 (causal) or 2 (bidirectional):

- `kernel(length)` -> real `[n_dir, H, length]`: the convolution kernel of each direction
  (direction 1 runs on the reversed sequence with its own output matrix);
- `diag(max_length)` -> `(dA, dB, C)`, complex `[H, modes]` (dA, dB may be `[modes]`, shared
  by the channels): the diagonal recurrence of direction 0, x_t = dA x_{t-1} + dB u_t,
  y_t = Re sum_n C_n x_t,n, whose impulse response is `kernel(length)[0]` (S4DKernel,
  DSSKernel, GSSKernel, DLRKernel). S4's DPLR state is not
  diagonal: `S4Kernel` offers `output_matrix` and `step` instead; S5 is a MIMO system without a
  per-channel kernel (`S5System`: `discrete`, `output_matrices`).

The blocks that compose them (`sptlib.layers.ssm`'s S4-style mixers, `sptlib.layers.gss`'s
GSSBlock) call `attach`, so the parameters live in the block's own scope under the names they
always had: checkpoints and the parameter draws of a seed are those of the blocks that created
the parameters themselves. Complex parameters are stored as real `[..., 2]` (re, im) arrays;
A / Lambda, dt, B, P and DLR's a, theta are in the "ssm" optimiser group
(`sptlib.layers.param_groups`), output matrices in "default". Initialisers:
`sptlib.layers.initializers`; the kernel arithmetic: `sptlib.kernels`.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sptlib import kernels
from sptlib.layers.initializers import (boxed, complex_normal, const, log_uniform, negated_exp,
                                        normal_over_modes, random_diagonal_inits, real_pair,
                                        s5_eigenbasis, sqrt_log_uniform, uniform)
from sptlib.layers.param_groups import ssm_group

CHANNEL_STATE = ("ssm_channels", "ssm_state")
DIR_CHANNEL_STATE = (None,) + CHANNEL_STATE + (None,)


def as_complex(p):
    """Real `[..., 2]` parameter -> complex `[...]`."""
    return jax.lax.complex(p[..., 0], p[..., 1])


def attach(block, kernel_module):
    """Puts `kernel_module`'s parameters in `block`'s scope and creates them now.

    Call in `block.setup` right after assigning the module. Linen runs a submodule's setup
    lazily; running it here keeps the order in which the block's scope draws parameter keys
    (the kernel's parameters, then the block's own), hence the same initial values as before the
    kernels were split out of the blocks.
    """
    nn.share_scope(block, kernel_module)
    kernel_module.create_parameters()


class SSMKernel(nn.Module):
    """Fields and parameter helpers shared by the kernel modules (see the module docstring)."""
    channels: int
    d_state: int = 64
    n_dir: int = 1
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    # S4 / S4D: trainable copies of (A, B) (state-spaces/s4 `n_ssm`), tiled over the channels
    # (channel h uses copy h mod n_ssm); 0 = one per channel. Must divide `channels`.
    n_ssm: int = 0

    # True where the output matrix of `diag` depends on `max_length` (a recurrent state then
    # carries it, since the step itself does not know the length).
    length_dependent_c = False

    def create_parameters(self):
        """Does nothing itself: Linen runs `setup`, which creates the parameters, before the
        first method a module runs (`attach`)."""

    def _p(self, name, init, shape, axes):
        """A float32 parameter with logical axes `axes`, in the default optimiser group."""
        return self.param(name, boxed(init, axes), shape, jnp.float32)

    def _ssm_p(self, name, init, shape, axes, group="ssm"):
        """A float32 parameter of the "ssm" optimiser group (own learning rate, no decay); the
        step sizes are in its sub-group "ssm_dt" (`sptlib.layers.param_groups`)."""
        return self.param(name, ssm_group(init, axes, group), shape, jnp.float32)

    def _log_dt(self, size, axis):
        """log dt `[size]`, log-uniform in [dt_min, dt_max] (optimiser group "ssm_dt")."""
        return self._ssm_p("log_dt", log_uniform(self.dt_min, self.dt_max), (size,), (axis,),
                           "ssm_dt")

    def _copies(self):
        """Number of (A, B) copies: `n_ssm` (0 = `channels`)."""
        n = self.n_ssm or self.channels
        if self.channels % n:
            raise ValueError(f"n_ssm={n} does not divide the {self.channels} channels")
        return n

    def _tied(self, p):
        """A tied parameter `[n_ssm, ...]` -> `[channels, ...]` (copies tiled, as `(v t)`)."""
        reps = self.channels // p.shape[0]
        return p if reps == 1 else jnp.tile(p, (reps,) + (1,) * (p.ndim - 1))

    def kernel(self, length):
        raise NotImplementedError

    def diag(self, max_length):
        raise NotImplementedError


class S4DKernel(SSMKernel):
    """S4D (Gu, Gupta, Goel & Re 2022): diagonal A `[H, N/2]` per channel (N/2 conjugate pairs).

    K_k = 2 Re sum_n C_n B_n (exp(dt A_n) - 1)/A_n exp(k dt A_n) (ZOH; bilinear optional).
    init_kind: lin | inv | legs | random (the unstructured control, `random_diagonal_inits`).
    Parameters: A_re (log of -Re A), A_im, B [ssm]; C `[n_dir, H, N/2, 2]`; log_dt [ssm].
    """
    init_kind: str = "lin"
    discretization: str = "zoh"

    def setup(self):
        h, n2, ax = self._copies(), self.d_state // 2, CHANNEL_STATE
        if self.init_kind == "random":
            # Unstructured control: every channel draws its own A and B from the init key.
            a_re, a_im, b = random_diagonal_inits(n2)
        else:
            a, b0 = kernels.s4d_init(self.d_state, self.init_kind)
            a_re = const(np.tile(np.log(-a.real), (h, 1)))
            a_im = const(np.tile(a.imag, (h, 1)))
            b = const(np.tile(real_pair(b0), (h, 1, 1)))
        self.A_re = self._ssm_p("A_re", a_re, (h, n2), ax)
        self.A_im = self._ssm_p("A_im", a_im, (h, n2), ax)
        self.B = self._ssm_p("B", b, (h, n2, 2), ax + (None,))
        hc = self.channels
        self.C = self._p("C", complex_normal(1.0), (self.n_dir, hc, n2, 2), DIR_CHANNEL_STATE)
        self.log_dt = self._log_dt(hc, "ssm_channels")

    def _A(self):
        return self._tied(jax.lax.complex(-jnp.exp(self.A_re), self.A_im))

    def _B(self):
        return self._tied(as_complex(self.B))

    def kernel(self, length):
        return kernels.s4d_kernel(self._A(), self._B(), as_complex(self.C), self.log_dt,
                                  length, self.discretization)

    def diag(self, max_length):
        dA, dB = kernels.s4d_discretize(self._A(), self._B(), self.log_dt,
                                        self.discretization)
        # the kernel sums over N/2 modes of conjugate pairs: 2 Re of one of each pair
        return dA, dB, 2 * as_complex(self.C[0])


class DSSKernel(SSMKernel):
    """DSS (Gupta, Gu & Berant 2022): Lambda `[N]` shared by the channels, W `[n_dir, H, N]`,
    dt `[H]`; N = d_state complex modes.

    version exp: Re lambda = -exp(Lambda_re); softmax: lambda = Lambda_re + i Lambda_im,
    normalised over the length (`sptlib.kernels.dss_kernel`). init_kind legs: the normal part of
    HiPPO-LegS (-1/2 + i w); random: the unstructured control. Parameters: Lambda_re, Lambda_im
    [ssm]; W; log_dt [ssm].
    """
    version: str = "exp"
    init_kind: str = "legs"

    @property
    def length_dependent_c(self):
        return self.version == "softmax"

    def setup(self):
        h, n = self.channels, self.d_state
        if self.init_kind == "random":
            re, im, _ = random_diagonal_inits(n)
            if self.version != "exp":
                re = negated_exp(re)
        elif self.init_kind == "legs":
            lam, _, _, _ = kernels.nplr_legs(2 * n)
            re = const(np.log(-lam.real) if self.version == "exp" else lam.real)
            im = const(lam.imag)
        else:
            raise ValueError(f"DSS init_kind must be legs | random, got {self.init_kind!r}")
        self.Lambda_re = self._ssm_p("Lambda_re", re, (n,), ("ssm_state",))
        self.Lambda_im = self._ssm_p("Lambda_im", im, (n,), ("ssm_state",))
        self.W = self._p("W", complex_normal(1.0), (self.n_dir, h, n, 2), DIR_CHANNEL_STATE)
        self.log_dt = self._log_dt(h, "ssm_channels")

    def _system(self):
        """(lambda `[N]`, W `[n_dir, H, N]` complex, log dt `[H]`)."""
        re = -jnp.exp(self.Lambda_re) if self.version == "exp" else self.Lambda_re
        return jax.lax.complex(re, self.Lambda_im), as_complex(self.W), self.log_dt

    def kernel(self, length):
        lam, w, log_dt = self._system()
        return kernels.dss_kernel(lam, w, log_dt, length, self.version)

    def diag(self, max_length):
        if self.version == "softmax" and max_length is None:
            raise ValueError("DSS-softmax: initial_state needs max_length (its kernel is "
                             "normalised over the sequence length)")
        lam, w, log_dt = self._system()
        return kernels.dss_discretize(lam, w[0], log_dt, max_length or None, self.version)


class GSSKernel(DSSKernel):
    """GSS's simplified DSS (Mehta et al. 2023, appendix A.2): the DSS-exp kernel with dt fixed
    to 1 and lambda = -exp(Lambda_re) + i exp(Lambda_im), N = d_state modes; output matrix C
    `[n_dir, H, N]`.

    The paper's pseudocode elides the ranges of its log_initializer: -Re lambda is drawn
    log-uniformly in [1e-3, 1e-1] and Im lambda in [1e-3, pi] (time scales of 10-1000 steps,
    frequencies below Nyquist). Parameters: Lambda_re, Lambda_im [ssm]; C.
    """

    def setup(self):
        h, n = self.channels, self.d_state
        self.Lambda_re = self._ssm_p("Lambda_re", log_uniform(1e-3, 1e-1), (n,), ("ssm_state",))
        self.Lambda_im = self._ssm_p("Lambda_im", log_uniform(1e-3, np.pi), (n,), ("ssm_state",))
        self.C = self._p("C", normal_over_modes(n), (self.n_dir, h, n, 2), DIR_CHANNEL_STATE)

    def _system(self):
        lam = jax.lax.complex(-jnp.exp(self.Lambda_re), jnp.exp(self.Lambda_im))
        return lam, as_complex(self.C), jnp.zeros((self.channels,))


class DLRKernel(SSMKernel):
    """DLR (Gupta, Mehta & Berant 2022): x_k = Lambda x_k-1 + u_k, y_k = Re(C x_k),
    lambda = exp(-a^2 + i theta) `[N]` shared by the channels, C `[n_dir, H, N]`.

    Init (`theta_init`): ``uniform`` (default): a^2 log-uniform in [1e-4, 1e-1] (|lambda| in
    [0.90, 0.9999]), theta uniform in [0, 2 pi), C complex normal with E|C|^2 = 1/N. ``omega``
    (the paper code's `Lambda_init: omega`, `W_scale: null`): a^2 = dt / 2 with dt log-uniform in
    [dt_min, dt_max], theta = 2 pi n / N, C's real and imaginary parts normal with std 1/N.
    Parameters: a, theta [ssm]; C [default, or ssm with `c_in_ssm_group`: the paper code's `W`,
    at `lr.W` without weight decay].
    """
    d_state: int = 1024
    c_in_ssm_group: bool = False
    theta_init: str = "uniform"  # uniform | omega

    def setup(self):
        h, n = self.channels, self.d_state
        if self.theta_init == "omega":
            half = np.log(0.5)
            a_init = lambda k, s, d=jnp.float32: jnp.sqrt(jnp.exp(  # noqa: E731
                half + log_uniform(self.dt_min, self.dt_max)(k, s, d)))
            theta = const(2 * np.pi * np.arange(n) / n)
            c_init = lambda k, s, d=jnp.float32: jax.random.normal(k, s, d) / n  # noqa: E731
        elif self.theta_init == "uniform":
            a_init, theta = sqrt_log_uniform(1e-4, 1e-1), uniform(0.0, 2 * np.pi)
            c_init = complex_normal(1.0 / np.sqrt(n))
        else:
            raise ValueError(f"DLR theta_init={self.theta_init!r} not in (uniform, omega)")
        self.a = self._ssm_p("a", a_init, (n,), ("ssm_state",))
        self.theta = self._ssm_p("theta", theta, (n,), ("ssm_state",))
        make = self._ssm_p if self.c_in_ssm_group else self._p
        self.C = make("C", c_init, (self.n_dir, h, n, 2), DIR_CHANNEL_STATE)

    def kernel(self, length):
        log_lambda = kernels.dlr_log_lambda(self.a, self.theta)
        return kernels.dlr_kernel(log_lambda, as_complex(self.C), length)

    def diag(self, max_length):
        dA = jnp.exp(kernels.dlr_log_lambda(self.a, self.theta))
        return dA, jnp.ones_like(dA), as_complex(self.C[0])


class S4Kernel(SSMKernel):
    """S4 (Gu, Goel & Re 2022), DPLR: A = Lambda - P P^* per channel (Lambda, P, B `[H, N/2]`,
    rank 1) from the NPLR HiPPO-LegS initialisation; bilinear discretisation; kernel by Cauchy +
    Woodbury at the roots of unity. C `[n_dir, H, N/2]` is the paper's "C tilde"
    (`sptlib.kernels.s4`). Parameters: A_re (log of -Re Lambda), A_im, P, B [ssm]; C; log_dt [ssm].

    Recurrence (full state `[batch, H, N]`): `output_matrix(max_length)` and `step`.
    """
    length_dependent_c = True

    def setup(self):
        h, n2, ax = self._copies(), self.d_state // 2, CHANNEL_STATE
        lam, p, b, _ = kernels.nplr_legs(self.d_state)
        tile = lambda v: const(np.tile(v, (h,) + (1,) * np.ndim(v)))  # noqa: E731
        self.A_re = self._ssm_p("A_re", tile(np.log(-lam.real)), (h, n2), ax)
        self.A_im = self._ssm_p("A_im", tile(lam.imag), (h, n2), ax)
        self.P = self._ssm_p("P", tile(real_pair(p)), (h, n2, 2), ax + (None,))
        self.B = self._ssm_p("B", tile(real_pair(b)), (h, n2, 2), ax + (None,))
        hc = self.channels
        self.C = self._p("C", complex_normal(1.0), (self.n_dir, hc, n2, 2), DIR_CHANNEL_STATE)
        self.log_dt = self._log_dt(hc, "ssm_channels")

    def _lambda(self):
        return self._tied(jax.lax.complex(-jnp.exp(self.A_re), self.A_im))

    def _pb(self):
        return self._tied(as_complex(self.P)), self._tied(as_complex(self.B))

    def kernel(self, length):
        return kernels.s4_kernel(self._lambda(), *self._pb(), as_complex(self.C), self.log_dt,
                                 length)

    def output_matrix(self, max_length):
        """Complex64 `[H, N]` output matrix of direction 0 for sequences of `max_length` steps
        (None: the infinite-length limit C = C tilde)."""
        c = kernels.s4_output_matrix(self._lambda(), *self._pb(), as_complex(self.C[0]),
                                     self.log_dt, max_length)
        return c.astype(jnp.complex64)

    def step(self, x, u):
        """One bilinear step of the full state x `[batch, H, N]` by input u `[batch, H]`."""
        return kernels.s4_step(x, u, self._lambda(), *self._pb(), self.log_dt)


class S5System(SSMKernel):
    """S5 (Smith, Warrington & Linderman 2023): one MIMO diagonal SSM with P = d_state (P/2
    conjugate pairs) shared by all H channels; per-state dt.

    init_kind legs: Lambda = eigenvalues of the normal part of HiPPO-LegS, B = V^* B0, C = C0 V
    with B0, C0 random (V its eigenvectors); random: the unstructured control
    (`random_diagonal_inits` for Lambda, complex normal B and C). Parameters: A_re (log of
    -Re Lambda), A_im, B `[P/2, H]` [ssm]; C `[n_dir, H, P/2]`; log_dt `[P/2]` [ssm].
    """
    discretization: str = "zoh"
    init_kind: str = "legs"

    def setup(self):
        h, p = self.channels, self.d_state
        n2 = p // 2
        b_axes = ("ssm_state", "ssm_channels", None)
        if self.init_kind == "random":
            # Unstructured control: random diagonal Lambda, B and C without an eigenbasis.
            a_re, a_im, _ = random_diagonal_inits(n2)
            b_init, c_init = complex_normal(1.0 / np.sqrt(h)), complex_normal(1.0 / np.sqrt(n2))
        elif self.init_kind == "legs":
            lam, _, _, v = kernels.nplr_legs(p)
            a_re, a_im = const(np.log(-lam.real)), const(lam.imag)
            b_init, c_init = s5_eigenbasis(v, h, p)
        else:
            raise ValueError(f"S5 init_kind must be legs | random, got {self.init_kind!r}")
        self.A_re = self._ssm_p("A_re", a_re, (n2,), ("ssm_state",))
        self.A_im = self._ssm_p("A_im", a_im, (n2,), ("ssm_state",))
        self.B = self._ssm_p("B", b_init, (n2, h, 2), b_axes)
        self.C = self._p("C", c_init, (self.n_dir, h, n2, 2), DIR_CHANNEL_STATE)
        self.log_dt = self._log_dt(n2, "ssm_state")

    def discrete(self):
        """(dLambda `[P/2]`, dB `[P/2, H]`), complex: x_t = dLambda x_t-1 + dB u_t."""
        lam = jax.lax.complex(-jnp.exp(self.A_re), self.A_im)
        return kernels.s5_discretize(lam, as_complex(self.B), self.log_dt, self.discretization)

    def output_matrices(self):
        """Complex C `[n_dir, H, P/2]`: y_t = 2 Re(C x_t) (`sptlib.kernels.s5_output`)."""
        return as_complex(self.C)

