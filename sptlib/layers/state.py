"""State-size accounting: the recurrent state a mixer carries per sequence when it decodes.

    state_size(mixer, *, d_model, causal=True, options=(), length=None, dtype=float32)
        -> StateSize(elements, bytes)

An *element* is one real number: a complex state entry counts two (its real and imaginary
parts), so `bytes = elements x dtype.itemsize` with `dtype=float32` is the memory of a
complex64 state too. Only what each sequence carries counts (leaves with a leading batch axis;
attention's shared position counter `index` does not).

Where the number comes from, in order:

1. the mixer's own `state_elements(max_length=None) -> int` (every built-in mixer declares it;
   a user's mixer may): attention its KV cache, 2 x heads x head_dim x `length`; the SSMs their
   (complex) state and, for S4 / DSS-softmax, the length-dependent output matrix the state carries;
   Mamba its short-convolution window plus the SSM state;
2. else the leaves of `initial_state(batch_size, length)` (abstractly, by `jax.eval_shape`).

`sptlib.layers.contract.check_mixer` checks that a declared number equals the second.
`sptlib.models.build.model_state_size(config.model, length)` sums over a model's layers.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

SHORT = 8  # sequence length of the abstract init (parameter shapes never depend on it)


@dataclasses.dataclass(frozen=True)
class StateSize:
    """Recurrent state per sequence: `elements` real numbers, `bytes` at the accounting dtype."""
    elements: int
    bytes: int

    def __add__(self, other):
        return StateSize(self.elements + other.elements, self.bytes + other.bytes)


def _real_count(leaf):
    return int(np.prod(leaf.shape)) * (2 if jnp.issubdtype(leaf.dtype, jnp.complexfloating)
                                       else 1)


def per_sequence_elements(tree_b1, tree_b2) -> int:
    """Real elements per sequence from abstract states at batch sizes 1 and 2 (the difference, so
    leaves without a batch axis, such as a shared position counter, do not count)."""
    total = lambda t: sum(_real_count(a) for a in jax.tree.leaves(t))
    return total(tree_b2) - total(tree_b1)


def actual_elements(mixer, variables, length) -> int:
    """Real elements per sequence of `mixer.initial_state(batch, length)` (bound by `variables`,
    or abstract ones), by `jax.eval_shape`."""
    states = [jax.eval_shape(lambda v, b=b: mixer.apply(v, b, length, method="initial_state"),
                             variables) for b in (1, 2)]
    return per_sequence_elements(*states)


def _module(mixer, d_model, causal, options):
    if isinstance(mixer, str):
        from sptlib.layers import get_mixer  # deferred: the registry imports nothing eagerly
        mixer = get_mixer(mixer)
    if isinstance(mixer, type):
        return mixer(d_model=d_model, causal=causal, dropout=0.0, **dict(options))
    return mixer


def state_size(mixer, *, d_model=None, causal=True, options=(), length=None,
               dtype=jnp.float32) -> StateSize:
    """State per sequence of `mixer` (a registry name, a class, or a constructed module).

    d_model, causal, options: the constructor arguments when `mixer` is a name or class
    (`options`: a mapping or `((key, value), ...)`). length: the sequence length (attention's KV
    cache grows with it; recurrent mixers ignore it). dtype: the element type of `bytes`.
    Raises ValueError when the mixer declares no state and has no `initial_state`.
    """
    module = _module(mixer, d_model, causal, options)
    itemsize = jnp.dtype(dtype).itemsize
    if hasattr(module, "state_elements"):
        elements = int(module.state_elements(length))
    elif hasattr(module, "initial_state"):
        x = jnp.zeros((1, SHORT, module.d_model), jnp.float32)
        variables = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), x, mask=None,
                                                       deterministic=True))
        elements = actual_elements(module, variables, length)
    else:
        raise ValueError(f"{type(module).__name__} declares no recurrent state "
                         f"(neither state_elements(max_length) nor initial_state)")
    return StateSize(elements, elements * itemsize)
