"""The mixer contract, checked on the user's own mixer before its first training step.

    y = mixer(x[batch, length, features], *, mask[batch, length] | None, deterministic: bool)
    y.shape == x.shape; constructed as cls(d_model=..., causal=..., dropout=..., [dtype=...])

and a `causal` attribute; with `causal=True` no output position may depend on a later input
position (checked by changing the inputs after the middle position and comparing the outputs
before it). Each broken rule is a one-line `ContractError` naming it and the measured deviation.
Beyond shape, finiteness and causality (in this order, each rule once):

- padding invariance: outputs at real positions (`mask` True) do not change when the padded
  positions' inputs do (padding at the end of one sequence and inside the other);
- gradients finite: of a random projection of the output, w.r.t. the parameters and the input
  (with padding); and equal to those of the float64 reference where the mixer declares one:
  a class attribute `conformance_reference = "method_name"` naming a method with `__call__`'s
  signature that computes the same function another way (e.g. a sequential scan, a direct
  convolution); the check runs it in float64 (`jax.enable_x64`) on float64 parameters;
- step = parallel (causal mixers with `initial_state` and `step`): stepping through the sequence
  from `initial_state(batch, length)` gives the parallel form's outputs;
- declared state size = actual: a `state_elements(max_length)` method equals the real numbers
  per sequence of `initial_state` (`sptlib.layers.state`);
- bfloat16 finite at long length: with `dtype=bfloat16` (where the constructor takes `dtype`)
  and bfloat16 inputs of length `LONG`, the outputs are finite.

The check runs once per (class, width, causality, options) before the first training step; on
a 2-core CPU it costs a few seconds per mixer (docs/api.md has the measured numbers).

Parameters may be plain (`self.param`, `nn.Dense`: replicated, default optimiser group), carry
logical axes for sharding (`nn.with_logical_partitioning(init, names)`), or join the SSM group
with its own learning rate and no weight decay (`sptlib.layers.param_groups.ssm_group(init,
names)`; docs/api.md).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from sptlib.layers import state as state_lib

BATCH, LENGTH = 2, 16
# bfloat16 finiteness length: long enough for decay products, sums over positions and softmax
# denominators to overflow or underflow in bfloat16, short enough to run before step one.
LONG = 2048
# Padded positions of the padding-invariance check: the end of sequence 0 and a run inside
# sequence 1.
PAD_END, PAD_INSIDE = 11, (3, 6)
# Relative tolerances (of the largest output / gradient magnitude), float32 against float32
# (padding, step) and float32 against the float64 reference (gradients).
RTOL, STEP_RTOL, GRAD_RTOL = 1e-4, 2e-3, 2e-3


class ContractError(ValueError):
    """A mixer breaks the contract (`sptlib.models.build.check_mixer` reports it as a config
    error)."""


def _fail(name, rule):
    return ContractError(f"config.model.mixer={name!r} breaks the mixer contract: {rule}")


def _apply(mixer, variables, x, mask, deterministic, key):
    # mutable=True: a mixer with batch statistics updates them; only the output is compared.
    y, _ = mixer.apply(variables, x, mask=mask, deterministic=deterministic,
                       rngs={"dropout": key}, mutable=True)
    return y


@functools.lru_cache(maxsize=32)
def check_mixer(cls, name, d_model, causal, options=()):
    """Runs the contract on `cls` (the user's mixer class) at width `d_model` (the model's).

    `options`: extra constructor keyword arguments as `((key, value), ...)`. Raises `ContractError`
    naming the broken rule; returns None (memoised: each class is checked once per setting).
    """
    try:
        mixer = cls(d_model=d_model, causal=causal, dropout=0.0, **dict(options))
    except TypeError as e:
        raise _fail(name, f"constructor cls(d_model=..., causal=..., dropout=...) failed "
                          f"({e})") from None
    if not hasattr(mixer, "causal"):
        raise _fail(name, "no `causal` attribute (set it from the constructor's causal=...)")
    if bool(mixer.causal) != bool(causal):
        raise _fail(name, f"causal={causal} was passed but its `causal` attribute is "
                          f"{mixer.causal!r}")
    kx, kp, kd = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(kx, (BATCH, LENGTH, d_model), jnp.float32)
    mask = jnp.ones((BATCH, LENGTH), bool)
    rngs = {"params": kp, "dropout": kd}
    try:
        variables = mixer.init(rngs, x, mask=mask, deterministic=True)
        y = _apply(mixer, variables, x, mask, True, kd)
        y_none = _apply(mixer, variables, x, None, False, kd)
    except TypeError as e:
        raise _fail(name, f"calling mixer(x[batch, length, features], *, mask=..., "
                          f"deterministic=...) failed ({e})") from None
    for got, how in ((y, "mask=[batch, length]"), (y_none, "mask=None")):
        if getattr(got, "shape", None) != x.shape:
            raise _fail(name, f"returned shape {getattr(got, 'shape', type(got).__name__)} for "
                              f"input [batch, length, features] = {x.shape} ({how}); the output "
                              f"must have the input's shape")
    if not jnp.all(jnp.isfinite(y)):
        raise _fail(name, "non-finite outputs on standard-normal inputs")
    if causal:
        cut = LENGTH // 2
        x2 = x.at[:, cut:].set(jax.random.normal(jax.random.PRNGKey(1), x[:, cut:].shape))
        y2 = _apply(mixer, variables, x2, mask, True, kd)
        per_position = jnp.max(jnp.abs(y2[:, :cut] - y[:, :cut]), axis=(0, 2))
        tol = 1e-4 * float(jnp.max(jnp.abs(y[:, :cut]))) + 1e-6
        changed = [i for i, d in enumerate(per_position.tolist()) if d > tol]
        if changed:
            raise _fail(name, f"causal=True but output position {changed[0]} changed (by "
                              f"{float(per_position[changed[0]]):.3g}) when only positions >= "
                              f"{cut} of the input changed: it peeks at the future")
    _padding_invariance(name, mixer, variables, x, kd)
    _gradients(name, mixer, variables, x, kd)
    if causal and hasattr(mixer, "initial_state") and hasattr(mixer, "step"):
        _step_equals_parallel(name, mixer, variables, x, y)
        _declared_state(name, mixer, variables)
    _bfloat16_long(name, cls, d_model, causal, options, kp, kd)


def _padding_mask():
    mask = np.ones((BATCH, LENGTH), bool)
    mask[0, PAD_END:] = False
    mask[1, PAD_INSIDE[0]:PAD_INSIDE[1]] = False
    return jnp.asarray(mask)


def _scale(a):
    return float(jnp.max(jnp.abs(a))) + 1e-6


def _padding_invariance(name, mixer, variables, x, key):
    mask = _padding_mask()
    noise = 10.0 * jax.random.normal(jax.random.PRNGKey(2), x.shape)
    x_pad = jnp.where(mask[..., None], x, noise)  # what the padding holds: large junk
    x_zero = jnp.where(mask[..., None], x, 0.0)
    run = jax.jit(lambda v, x: _apply(mixer, v, x, mask, True, key))
    y_pad, y_zero = run(variables, x_pad), run(variables, x_zero)
    diff = jnp.where(mask[..., None], jnp.abs(y_pad - y_zero), 0.0).max(-1)
    dev = float(diff.max())
    if not dev <= RTOL * _scale(jnp.where(mask[..., None], y_zero, 0.0)):
        b, i = np.unravel_index(int(jnp.argmax(diff)), diff.shape)
        raise _fail(name, f"padding invariance: the output at real position {i} of sequence {b} "
                          f"changed by {dev:.3g} when only padded positions (mask False) of "
                          f"the input changed")


def _loss_fn(mixer, method, mask, key):
    def loss(params, rest, x, w):
        y = mixer.apply(dict(rest, params=params), x, mask=mask, deterministic=True,
                        rngs={"dropout": key}, method=method, mutable=True)[0]
        return jnp.sum(jnp.where(mask[..., None], y, 0) * w)
    return jax.jit(jax.grad(loss, argnums=(0, 2)))


def _gradients(name, mixer, variables, x, key):
    mask = _padding_mask()
    params = variables.get("params", {})
    rest = {k: v for k, v in variables.items() if k != "params"}
    w = jax.random.normal(jax.random.PRNGKey(3), x.shape)
    grads = _loss_fn(mixer, None, mask, key)(params, rest, x, w)
    flat = jax.tree_util.tree_flatten_with_path(grads)[0]
    path = lambda p: "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in p)
    for p, g in flat:
        if not jnp.all(jnp.isfinite(g)):
            where = "the input" if p[0].idx == 1 else f"parameter {path(p[1:])!r}"
            raise _fail(name, f"gradients finite: a non-finite gradient w.r.t. {where}")
    reference = getattr(type(mixer), "conformance_reference", None)
    if not reference:
        return
    with jax.enable_x64(True):
        to64 = lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a
        ref = _loss_fn(mixer, reference, mask, key)(
            jax.tree.map(to64, params), jax.tree.map(to64, rest), to64(x), to64(w))
        for (p, g), r in zip(flat, jax.tree.leaves(ref)):
            dev = float(jnp.max(jnp.abs(g.astype(jnp.float64) - r))) if g.size else 0.0
            if not dev <= GRAD_RTOL * (float(jnp.max(jnp.abs(r))) + 1e-6):
                where = "the input" if p[0].idx == 1 else f"parameter {path(p[1:])!r}"
                raise _fail(name, f"gradients equal the float64 reference "
                                  f"{reference!r}: the gradient w.r.t. {where} differs by "
                                  f"{dev:.3g} (max |reference| {float(jnp.max(jnp.abs(r))):.3g})")


def _step_equals_parallel(name, mixer, variables, x, y):
    try:
        state0 = mixer.apply(variables, BATCH, LENGTH, method="initial_state")

        def body(state, x_t):
            y_t, state = mixer.apply(variables, x_t, state, method="step")
            return state, y_t
        _, ys = jax.jit(lambda s, xs: jax.lax.scan(body, s, xs))(state0, jnp.swapaxes(x, 0, 1))
    except (TypeError, ValueError) as e:
        raise _fail(name, f"step = parallel: initial_state(batch_size, max_length) / "
                          f"step(x_t[batch, features], state) -> (y_t, state) failed "
                          f"({e})") from None
    ys = jnp.swapaxes(ys, 0, 1)
    if ys.shape != y.shape:
        raise _fail(name, f"step = parallel: the steps' outputs stack to {ys.shape}, the "
                          f"parallel form's are {y.shape}")
    per_position = jnp.max(jnp.abs(ys - y), axis=(0, 2))
    dev = float(per_position.max())
    tol = STEP_RTOL * _scale(y)
    if not dev <= tol:
        i = next(i for i, d in enumerate(per_position.tolist()) if not d <= tol)  # the first
        raise _fail(name, f"step = parallel: step {i} differs from the parallel form by "
                          f"{float(per_position[i]):.3g} (max |output| {_scale(y):.3g}; "
                          f"largest deviation {dev:.3g})")


def _declared_state(name, mixer, variables):
    if not hasattr(mixer, "state_elements"):
        return
    declared = int(mixer.state_elements(LENGTH))
    actual = state_lib.actual_elements(mixer, variables, LENGTH)
    if declared != actual:
        raise _fail(name, f"declared state size = actual: state_elements({LENGTH}) = "
                          f"{declared} but initial_state holds {actual} real numbers per "
                          f"sequence")


def _bfloat16_long(name, cls, d_model, causal, options, kp, kd):
    options = dict(options)
    fields = getattr(cls, "__dataclass_fields__", {})
    if "dtype" in fields and "dtype" not in options:
        options["dtype"] = jnp.bfloat16
    mixer = cls(d_model=d_model, causal=causal, dropout=0.0, **options)
    x = jax.random.normal(jax.random.PRNGKey(4), (1, LONG, d_model)).astype(jnp.bfloat16)
    mask = jnp.ones((1, LONG), bool)
    variables = mixer.init({"params": kp, "dropout": kd}, x[:, :LENGTH], mask=mask[:, :LENGTH],
                           deterministic=True)
    y = jax.jit(lambda v, x: _apply(mixer, v, x, mask, True, kd))(variables, x)
    finite = jnp.isfinite(y.astype(jnp.float32)).all(axis=(0, 2))
    if not bool(finite.all()):
        i = int(jnp.argmin(finite))
        raise _fail(name, f"bfloat16 finite at long length: non-finite outputs from position "
                          f"{i} of {LONG} (bfloat16 inputs and compute dtype)")
