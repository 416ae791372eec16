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
theta) are labelled by `ssm_param_labels`.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sptlib import kernels as K

# Leaf names of parameters in the "ssm" optimizer group (see ssm_param_labels).
SSM_PARAM_NAMES = frozenset(
    {"A_re", "A_im", "Lambda_re", "Lambda_im", "log_dt", "B", "P", "a", "theta"})


def ssm_param_labels(params):
    """Same-structure pytree of "ssm" | "default" for an optimizer (optax.multi_transform).

    "ssm" marks the state matrix (A / Lambda, DLR's a and theta), the step size log_dt and, as in
    state-spaces/s4, B and P: they get their own learning rate and no weight decay. Works on
    plain and on logically boxed (nn.Partitioned) parameter trees.
    """
    def label(path, _):
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return "ssm" if names and names[-1] in SSM_PARAM_NAMES else "default"

    return jax.tree_util.tree_map_with_path(label, params)


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

def _complex(p):
    """Real `[..., 2]` parameter -> complex `[...]`."""
    return jax.lax.complex(p[..., 0], p[..., 1])


def _real_pair(z):
    z = np.asarray(z)
    return np.stack([z.real, z.imag], axis=-1)


def _const(value):
    """Initialiser returning a fixed (NumPy) value."""
    def init(key, shape, dtype=jnp.float32):
        del key
        v = jnp.asarray(value, dtype)
        assert v.shape == tuple(shape), (v.shape, shape)
        return v
    return init


def _log_uniform(low, high):
    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, np.log(low), np.log(high))
    return init


def random_diagonal_inits(modes):
    """The unstructured control of the structured-vs-random ablation (`init_kind='random'`):
    initialisers of log(-Re A), Im A and B ((re, im) pairs), drawn from the parameter's key.

    -Re A uniform in [0.1, 1) (stable), Im A uniform in [0, pi * modes) — the span S4D-Lin
    covers, but unsorted and unevenly spaced — and B complex normal with E|B|^2 = 1.
    """
    def a_re(key, shape, dtype=jnp.float32):
        return jnp.log(jax.random.uniform(key, shape, dtype, 0.1, 1.0))

    def a_im(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, 0.0, np.pi * modes)

    return a_re, a_im, _complex_normal(1.0)


def _negated_exp(init):
    def wrapped(key, shape, dtype=jnp.float32):
        return -jnp.exp(init(key, shape, dtype))
    return wrapped


def _complex_normal(std):
    """(re, im) pairs of a complex normal with E|z|^2 = std^2."""
    def init(key, shape, dtype=jnp.float32):
        return jax.random.normal(key, shape, dtype) * (std / np.sqrt(2.0))
    return init


# ----------------------------------------------------------------------------------------------
# the S4 block shared by every mixer
# ----------------------------------------------------------------------------------------------

class _SSMBlock(nn.Module):
    """Shared S4 block: subclasses define the SSM (`_setup_ssm`, `_ssm`, `_init_ssm_state`,
    `_ssm_step`). Fields common to every mixer: d_model, causal, dropout, d_state, dt_min,
    dt_max, gelu_approximate (tanh GELU, faster on CPU), dtype (of the output projection)."""
    d_model: int
    causal: bool = False
    dropout: float = 0.0
    d_state: int = 64
    dt_min: float = 1e-3
    dt_max: float = 1e-1
    gelu_approximate: bool = True
    dtype: Any = jnp.float32

    @property
    def n_dir(self):
        return 1 if self.causal else 2

    def _p(self, name, init, shape, axes):
        return self.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)

    def setup(self):
        self._setup_ssm()
        self.D = self._p("D", nn.initializers.normal(1.0), (self.d_model,), ("ssm_channels",))
        self.out_proj = nn.Dense(
            2 * self.d_model, dtype=self.dtype,
            kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                     ("embed", "mlp")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)),
            name="out_proj")
        self.drop = nn.Dropout(self.dropout)

    # -- subclass interface ---------------------------------------------------------------------
    def _setup_ssm(self):
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

    def step(self, x_t, state):
        """One recurrent step: x_t `[batch, d_model]` -> (y_t `[batch, d_model]`, state)."""
        self._require_causal()
        in_dtype = x_t.dtype
        x_t = x_t.astype(jnp.float32)
        y, state = self._ssm_step(x_t, state)
        y = y + self.D * x_t
        return self._post(y, True).astype(in_dtype), state


class _ConvSSM(_SSMBlock):
    """A block whose SSM is a long convolution with kernel `kernel(length) -> [n_dir, H, L]`
    and whose recurrence is diagonal: `_diag(max_length) -> (dA, dB, C)` with
    x_t = dA x_{t-1} + dB u_t, y_t = Re sum_n C_n x_t,n."""

    def kernel(self, length):
        raise NotImplementedError

    def _ssm(self, x):
        k = self.kernel(x.shape[1])
        if self.causal:
            return K.fft_conv(x, k[0], self.D)
        return K.fft_conv_bidirectional(x, k[0], k[1], self.D)

    # Output matrices depending on the length are carried in the state.
    _length_dependent_c = False

    def _diag(self, max_length):
        raise NotImplementedError

    def _init_ssm_state(self, batch_size, max_length):
        _, _, c = self._diag(max_length)
        state = {"x": jnp.zeros((batch_size,) + c.shape, jnp.complex64)}
        if self._length_dependent_c:
            state["C"] = jnp.broadcast_to(c, (batch_size,) + c.shape)
        return state

    def _ssm_step(self, x_t, state):
        # (a length-dependent C comes from the state; the length passed here is then unused)
        dA, dB, c = self._diag(1)
        if self._length_dependent_c:
            c = state["C"]
        x = dA * state["x"] + dB * x_t[..., None]
        y = jnp.sum(c * x, axis=-1).real
        return y, dict(state, x=x)


# ----------------------------------------------------------------------------------------------
# S4D
# ----------------------------------------------------------------------------------------------

class S4DMixer(_ConvSSM):
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
            self.A_re = self._p("A_re", a_re, (h, n2), ax)
            self.A_im = self._p("A_im", a_im, (h, n2), ax)
            self.B = self._p("B", b, (h, n2, 2), ax + (None,))
        else:
            a, b = K.s4d_init(self.d_state, self.init_kind)
            self.A_re = self._p("A_re", _const(np.tile(np.log(-a.real), (h, 1))), (h, n2), ax)
            self.A_im = self._p("A_im", _const(np.tile(a.imag, (h, 1))), (h, n2), ax)
            self.B = self._p("B", _const(np.tile(_real_pair(b), (h, 1, 1))), (h, n2, 2),
                             ax + (None,))
        self.C = self._p("C", _complex_normal(1.0), (self.n_dir, h, n2, 2),
                         (None,) + ax + (None,))
        self.log_dt = self._p("log_dt", _log_uniform(self.dt_min, self.dt_max), (h,),
                              ("ssm_channels",))

    def _A(self):
        return jax.lax.complex(-jnp.exp(self.A_re), self.A_im)

    def kernel(self, length):
        return K.s4d_kernel(self._A(), _complex(self.B), _complex(self.C), self.log_dt, length,
                            self.discretization)

    def _diag(self, max_length):
        dA, dB = K.s4d_discretize(self._A(), _complex(self.B), self.log_dt, self.discretization)
        return dA, dB, 2 * _complex(self.C[0])


# ----------------------------------------------------------------------------------------------
# DSS
# ----------------------------------------------------------------------------------------------

class DSSMixer(_ConvSSM):
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
                a_re = _negated_exp(a_re)
            self.Lambda_re = self._p("Lambda_re", a_re, (n,), ("ssm_state",))
            self.Lambda_im = self._p("Lambda_im", a_im, (n,), ("ssm_state",))
        elif self.init_kind == "legs":
            lam, _, _, _ = K.nplr_legs(2 * n)
            re = np.log(-lam.real) if self.version == "exp" else lam.real
            self.Lambda_re = self._p("Lambda_re", _const(re), (n,), ("ssm_state",))
            self.Lambda_im = self._p("Lambda_im", _const(lam.imag), (n,), ("ssm_state",))
        else:
            raise ValueError(f"DSS init_kind must be legs | random, got {self.init_kind!r}")
        self.W = self._p("W", _complex_normal(1.0), (self.n_dir, h, n, 2),
                         (None, "ssm_channels", "ssm_state", None))
        self.log_dt = self._p("log_dt", _log_uniform(self.dt_min, self.dt_max), (h,),
                              ("ssm_channels",))

    def _lambda(self):
        re = -jnp.exp(self.Lambda_re) if self.version == "exp" else self.Lambda_re
        return jax.lax.complex(re, self.Lambda_im)

    def kernel(self, length):
        return K.dss_kernel(self._lambda(), _complex(self.W), self.log_dt, length, self.version)

    def _diag(self, max_length):
        if self.version == "softmax" and max_length is None:
            raise ValueError("DSS-softmax: initial_state needs max_length (its kernel is "
                             "normalised over the sequence length)")
        return K.dss_discretize(self._lambda(), _complex(self.W[0]), self.log_dt,
                                max_length or None, self.version)


# ----------------------------------------------------------------------------------------------
# DLR
# ----------------------------------------------------------------------------------------------

class DLRMixer(_ConvSSM):
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
            return jnp.sqrt(jnp.exp(_log_uniform(1e-4, 1e-1)(key, shape, dtype)))

        def theta_init(key, shape, dtype=jnp.float32):
            return jax.random.uniform(key, shape, dtype, 0.0, 2 * np.pi)

        self.a = self._p("a", a_init, (n,), ("ssm_state",))
        self.theta = self._p("theta", theta_init, (n,), ("ssm_state",))
        self.C = self._p("C", _complex_normal(1.0 / np.sqrt(n)), (self.n_dir, h, n, 2),
                         (None, "ssm_channels", "ssm_state", None))

    def kernel(self, length):
        return K.dlr_kernel(K.dlr_log_lambda(self.a, self.theta), _complex(self.C), length)

    def _diag(self, max_length):
        dA = jnp.exp(K.dlr_log_lambda(self.a, self.theta))
        return dA, jnp.ones_like(dA), _complex(self.C[0])


# ----------------------------------------------------------------------------------------------
# S4 (DPLR)
# ----------------------------------------------------------------------------------------------

class S4Mixer(_ConvSSM):
    """S4 (Gu, Goel & Re 2022) with the NPLR HiPPO-LegS initialisation: A = Lambda - P P^* per
    channel (rank 1), bilinear discretisation, kernel by Cauchy + Woodbury at the roots of unity.

    C is the "C tilde" of the paper (see `sptlib.kernels.s4`). Parameters: A_re (log of
    -Re Lambda), A_im, P, B, log_dt [ssm]; C, D, out_proj [default].
    """
    _length_dependent_c = True

    def _setup_ssm(self):
        h, n2 = self.d_model, self.d_state // 2
        lam, p, b, _ = K.nplr_legs(self.d_state)
        ax = ("ssm_channels", "ssm_state")
        tile = lambda v: np.tile(v, (h,) + (1,) * np.ndim(v))  # noqa: E731
        self.A_re = self._p("A_re", _const(tile(np.log(-lam.real))), (h, n2), ax)
        self.A_im = self._p("A_im", _const(tile(lam.imag)), (h, n2), ax)
        self.P = self._p("P", _const(tile(_real_pair(p))), (h, n2, 2), ax + (None,))
        self.B = self._p("B", _const(tile(_real_pair(b))), (h, n2, 2), ax + (None,))
        self.C = self._p("C", _complex_normal(1.0), (self.n_dir, h, n2, 2),
                         (None,) + ax + (None,))
        self.log_dt = self._p("log_dt", _log_uniform(self.dt_min, self.dt_max), (h,),
                              ("ssm_channels",))

    def _lambda(self):
        return jax.lax.complex(-jnp.exp(self.A_re), self.A_im)

    def kernel(self, length):
        return K.s4_kernel(self._lambda(), _complex(self.P), _complex(self.B),
                           _complex(self.C), self.log_dt, length)

    def _init_ssm_state(self, batch_size, max_length):
        c = K.s4_output_matrix(self._lambda(), _complex(self.P), _complex(self.B),
                               _complex(self.C[0]), self.log_dt, max_length)
        c = c.astype(jnp.complex64)
        return {"x": jnp.zeros((batch_size,) + c.shape, jnp.complex64),
                "C": jnp.broadcast_to(c, (batch_size,) + c.shape)}

    def _ssm_step(self, x_t, state):
        x = K.s4_step(state["x"], x_t, self._lambda(), _complex(self.P), _complex(self.B),
                      self.log_dt)
        return jnp.sum(state["C"] * x, axis=-1).real, dict(state, x=x)


# ----------------------------------------------------------------------------------------------
# S5
# ----------------------------------------------------------------------------------------------

class S5Mixer(_SSMBlock):
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
            self.A_re = self._p("A_re", a_re, (n2,), ("ssm_state",))
            self.A_im = self._p("A_im", a_im, (n2,), ("ssm_state",))
            self.B = self._p("B", _complex_normal(1.0 / np.sqrt(h)), (n2, h, 2),
                             ("ssm_state", "ssm_channels", None))
            self.C = self._p("C", _complex_normal(1.0 / np.sqrt(n2)), (self.n_dir, h, n2, 2),
                             (None, "ssm_channels", "ssm_state", None))
            self.log_dt = self._p("log_dt", _log_uniform(self.dt_min, self.dt_max), (n2,),
                                  ("ssm_state",))
            return
        if self.init_kind != "legs":
            raise ValueError(f"S5 init_kind must be legs | random, got {self.init_kind!r}")
        lam, _, _, v = K.nplr_legs(p)
        self.A_re = self._p("A_re", _const(np.log(-lam.real)), (n2,), ("ssm_state",))
        self.A_im = self._p("A_im", _const(lam.imag), (n2,), ("ssm_state",))
        vh = v.conj().T  # [P/2, P]

        vh = jnp.asarray(vh, jnp.complex64)
        v = jnp.asarray(v, jnp.complex64)

        def b_init(key, shape, dtype=jnp.float32):
            b = vh @ nn.initializers.lecun_normal()(key, (p, h), jnp.float32)
            return jnp.stack([b.real, b.imag], axis=-1).astype(dtype)

        def c_init(key, shape, dtype=jnp.float32):
            c = (jax.random.normal(key, (shape[0], h, p)) / np.sqrt(p)) @ v
            return jnp.stack([c.real, c.imag], axis=-1).astype(dtype)

        self.B = self._p("B", b_init, (n2, h, 2), ("ssm_state", "ssm_channels", None))
        self.C = self._p("C", c_init, (self.n_dir, h, n2, 2),
                         (None, "ssm_channels", "ssm_state", None))
        self.log_dt = self._p("log_dt", _log_uniform(self.dt_min, self.dt_max), (n2,),
                              ("ssm_state",))

    def _discrete(self):
        lam = jax.lax.complex(-jnp.exp(self.A_re), self.A_im)
        return K.s5_discretize(lam, _complex(self.B), self.log_dt, self.discretization)

    def _ssm(self, x):
        dlam, db = self._discrete()
        bu = K.s5_input(db, x)
        c = _complex(self.C)
        y = K.s5_output(c[0], K.s5_scan(dlam, bu))
        if not self.causal:
            y = y + K.s5_output(c[1], K.s5_scan(dlam, bu, reverse=True))
        return y + self.D * x

    def _init_ssm_state(self, batch_size, max_length):
        return {"x": jnp.zeros((batch_size, self.d_state // 2), jnp.complex64)}

    def _ssm_step(self, x_t, state):
        dlam, db = self._discrete()
        x = dlam * state["x"] + K.s5_input(db, x_t)
        return K.s5_output(_complex(self.C[0]), x), {"x": x}


__all__ = ["S4Mixer", "S4DMixer", "DSSMixer", "DLRMixer", "S5Mixer", "ssm_param_labels",
           "SSM_PARAM_NAMES"]
