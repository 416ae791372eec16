"""The mixer contract, checked on the user's own mixer before its first training step.

    y = mixer(x[batch, length, features], *, mask[batch, length] | None, deterministic: bool)
    y.shape == x.shape; constructed as cls(d_model=..., causal=..., dropout=..., [dtype=...])

and a `causal` attribute; with `causal=True` no output position may depend on a later input
position (checked by changing the inputs after the middle position and comparing the outputs
before it). Each broken rule is a one-line `ContractError` naming it.

Parameters may be plain (`self.param`, `nn.Dense`: replicated, default optimiser group), carry
logical axes for sharding (`nn.with_logical_partitioning(init, names)`), or join the SSM group
with its own learning rate and no weight decay (`sptlib.layers.param_groups.ssm_group(init,
names)`; docs/api.md).
"""

import functools

import jax
import jax.numpy as jnp

BATCH, LENGTH = 2, 16


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
