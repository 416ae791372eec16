"""Optimiser groups marked by the module that creates a parameter, not by its name.

The SSM layers create their state matrix (A / Lambda, DLR's a and theta), step size log_dt and,
as in state-spaces/s4, B and P with `ssm_group(init, names)`: the parameter is boxed as an
`SSMParam`, a `nn.LogicallyPartitioned` (same logical axes, same sharding, same unboxed array)
whose type says "own learning rate, no weight decay". `param_labels` reads that type, so a
parameter called `B` in any other module stays in the default group. The step sizes (log dt) are
`SSMDtParam`s, an "ssm" parameter of their own group "ssm_dt", so that they can take another
learning rate than A and B (the paper code's `lr: {dt: null, A: 1e-3, B: 1e-3}`: log dt at the
global lr without weight decay; `optim.ssm_dt_lr`).
"""

import flax.linen as nn
import flax.struct
import jax

@flax.struct.dataclass
class SSMParam(nn.LogicallyPartitioned):
    """A logically partitioned parameter of the "ssm" optimiser group."""


@flax.struct.dataclass
class SSMDtParam(SSMParam):
    """An "ssm" parameter of the step-size group "ssm_dt" (log dt)."""


def ssm_group(init, names, group="ssm"):
    """`init` boxed as an `SSMParam` (group "ssm") or `SSMDtParam` (group "ssm_dt") with logical
    axis `names` (one per dimension)."""
    box = {"ssm": SSMParam, "ssm_dt": SSMDtParam}[group]

    def wrapper(*args, **kwargs):
        return box(init(*args, **kwargs), names)
    return wrapper


class SSMShape(jax.ShapeDtypeStruct):
    """The abstract shape of an "ssm" parameter once unboxed (`unbox_abstract`), so abstract
    trees keep the group that `nn.unbox` would drop (`sptlib.train.steps.state_logical_specs`)."""
    __slots__ = ()


class SSMDtShape(SSMShape):
    """`SSMShape` of an "ssm_dt" parameter."""
    __slots__ = ()


def unbox_abstract(tree):
    """`nn.unbox` of an abstract variables tree (`jax.eval_shape` of `model.init`), with the
    shapes of "ssm" parameters as `SSMShape`."""
    def unbox(x):
        if isinstance(x, SSMParam) and isinstance(x.value, jax.ShapeDtypeStruct):
            v = x.value
            shape = SSMDtShape if isinstance(x, SSMDtParam) else SSMShape
            return shape(v.shape, v.dtype, sharding=v.sharding, weak_type=v.weak_type)
        return x.unbox() if isinstance(x, nn.Partitioned) else x
    return jax.tree.map(unbox, tree, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def param_labels(params):
    """Same-structure pytree of "ssm_dt" | "ssm" | "default" for `optax.multi_transform`.

    `params` is boxed (`model.init(...)["params"]`, or its `jax.eval_shape`) or abstract and
    unboxed by `unbox_abstract`: "ssm" exactly for parameters created by `ssm_group`. Plain
    arrays carry no group, so they are an error rather than a silent "default". The labels have
    the structure of the unboxed tree.
    """
    def label(x):
        if isinstance(x, (SSMDtParam, SSMDtShape)):
            return "ssm_dt"
        if isinstance(x, (SSMParam, SSMShape)):
            return "ssm"
        if isinstance(x, (nn.Partitioned, jax.ShapeDtypeStruct)):
            return "default"
        raise ValueError(f"param_labels: a plain {type(x).__name__} carries no optimiser group; "
                         "pass the boxed parameters (model.init before nn.unbox) or abstract "
                         "ones from sptlib.train.steps.state_logical_specs")
    return jax.tree.map(label, params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
