"""Optimiser groups marked by the module that creates a parameter, not by its name.

The SSM layers create their state matrix (A / Lambda, DLR's a and theta), step size log_dt and,
as in state-spaces/s4, B and P with `ssm_group(init, names)`: the parameter is boxed as an
`SSMParam`, a `nn.LogicallyPartitioned` (same logical axes, same sharding, same unboxed array)
whose type says "own learning rate, no weight decay". `param_labels` reads that type, so a
parameter called `B` in any other module stays in the default group.
"""

import flax.linen as nn
import flax.struct
import jax

GROUPS = ("default", "ssm")


@flax.struct.dataclass
class SSMParam(nn.LogicallyPartitioned):
    """A logically partitioned parameter of the "ssm" optimiser group."""


def ssm_group(init, names):
    """`init` boxed as an `SSMParam` with logical axis `names` (one per dimension)."""
    def wrapper(*args, **kwargs):
        return SSMParam(init(*args, **kwargs), names)
    return wrapper


class SSMShape(jax.ShapeDtypeStruct):
    """The abstract shape of an "ssm" parameter once unboxed (`unbox_abstract`), so abstract
    trees keep the group that `nn.unbox` would drop (`sptlib.train.steps.state_logical_specs`)."""
    __slots__ = ()


def unbox_abstract(tree):
    """`nn.unbox` of an abstract variables tree (`jax.eval_shape` of `model.init`), with the
    shapes of "ssm" parameters as `SSMShape`."""
    def unbox(x):
        if isinstance(x, SSMParam) and isinstance(x.value, jax.ShapeDtypeStruct):
            v = x.value
            return SSMShape(v.shape, v.dtype, sharding=v.sharding, weak_type=v.weak_type)
        return x.unbox() if isinstance(x, nn.Partitioned) else x
    return jax.tree.map(unbox, tree, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def param_labels(params):
    """Same-structure pytree of "ssm" | "default" for `optax.multi_transform`.

    `params` is boxed (`model.init(...)["params"]`, or its `jax.eval_shape`) or abstract and
    unboxed by `unbox_abstract`: "ssm" exactly for parameters created by `ssm_group`. Plain
    arrays carry no group, so they are an error rather than a silent "default". The labels have
    the structure of the unboxed tree.
    """
    def label(x):
        if isinstance(x, (SSMParam, SSMShape)):
            return "ssm"
        if isinstance(x, (nn.Partitioned, jax.ShapeDtypeStruct)):
            return "default"
        raise ValueError(f"param_labels: a plain {type(x).__name__} carries no optimiser group; "
                         "pass the boxed parameters (model.init before nn.unbox) or abstract "
                         "ones from sptlib.train.steps.state_logical_specs")
    return jax.tree.map(label, params, is_leaf=lambda x: isinstance(x, nn.Partitioned))
