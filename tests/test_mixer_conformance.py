"""The conformance check (`sptlib.layers.contract.check_mixer`) on every registered mixer, causal
and bidirectional, and on user mixers that each break one rule (one line naming the rule and
the measured deviation).

The truths: a mixer that reads its padding, a step that drops a term, a declared state one
element off, a gradient that is NaN where the output is finite, a reference that computes
another function, a decay product that overflows at length 2048 — each must be caught; a
correct mixer of each kind must pass.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from sptlib.layers import MIXERS, contract, get_mixer
from sptlib.models.config import model_config

WIDTH = 16
# Options that fit WIDTH (defaults sized for d_model >= 64 where they would not).
SMALL = {"mamba2": {"head_dim": 16}, "dlr": {"d_state": 64}, "gss": {"d_state": 64},
         "rwkv7": {"head_dim": 8}}


def _options(name):
    opts = dict(model_config().get(name) or {})
    opts.update(SMALL.get(name, {}))
    return tuple(sorted(opts.items()))


@pytest.mark.slow  # every rule compiles each mixer several times: ~10-60 s a case on 2 cores
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_every_registered_mixer_conforms(name, causal):
    contract.check_mixer.cache_clear()
    contract.check_mixer(get_mixer(name), name, WIDTH, causal, _options(name))


def test_s4d_conforms():
    """The default suite's sample of the sweep above (causal S4D: every rule runs; ~10 s idle,
    28 s for attention on the loaded 2-core machine, so the rest is in the slow sweep)."""
    contract.check_mixer(get_mixer("s4d"), "s4d", WIDTH, True, _options("s4d"))


# -- user mixers that break one rule each --------------------------------------------------------

class _Base(nn.Module):
    d_model: int
    causal: bool = True
    dropout: float = 0.0


class CumSum(_Base):
    """Causal running sum of the masked input, with a correct step, declared state and a
    sequential reference: passes every rule."""
    conformance_reference = "sequential"

    def setup(self):
        self.w = self.param("w", nn.initializers.ones, (self.d_model,))

    def __call__(self, x, *, mask=None, deterministic=True):
        w = self.w
        if mask is not None:
            x = jnp.where(mask[..., None], x, 0.0)
        return jnp.cumsum(x, axis=1) * w

    def sequential(self, x, *, mask=None, deterministic=True):
        w = self.w
        if mask is not None:
            x = jnp.where(mask[..., None], x, 0.0)
        _, ys = jax.lax.scan(lambda s, xt: (s + xt, s + xt), jnp.zeros_like(x[:, 0]),
                             jnp.swapaxes(x, 0, 1))
        return jnp.swapaxes(ys, 0, 1) * w

    def initial_state(self, batch_size, max_length=None):
        return {"sum": jnp.zeros((batch_size, self.d_model))}

    def state_elements(self, max_length=None):
        return self.d_model

    def step(self, x_t, state):
        w = self.w
        s = state["sum"] + x_t
        return s * w, {"sum": s}


class ReadsPadding(CumSum):
    """Sums every position, padding included."""
    def __call__(self, x, *, mask=None, deterministic=True):
        return super().__call__(x, mask=None)


class StepDropsInput(CumSum):
    def step(self, x_t, state):
        y, new = super().step(x_t, state)
        return y - x_t, new  # the sum without the current input


class StateOffByOne(CumSum):
    def state_elements(self, max_length=None):
        return self.d_model + 1


class NaNGradient(CumSum):
    """Finite output, NaN gradient where x < 0: sqrt'(0) · 0."""
    def __call__(self, x, *, mask=None, deterministic=True):
        return super().__call__(x, mask=mask) + jnp.sqrt(jnp.maximum(x, 0.0))


class WrongReference(CumSum):
    def sequential(self, x, *, mask=None, deterministic=True):
        return 2.0 * super().sequential(x, mask=mask)


class DecayOverflow(_Base):
    """A running product of (1 + |x|): finite at length 16, overflows long before 2048."""
    dtype: jnp.dtype = jnp.float32

    def __call__(self, x, *, mask=None, deterministic=True):
        if mask is not None:
            x = jnp.where(mask[..., None], x, 0.0)
        return jnp.cumprod(1.0 + 0.5 * jnp.abs(x).astype(self.dtype), axis=1)


@pytest.mark.parametrize("cls,needle", [
    (ReadsPadding, "padding invariance: the output at real position"),
    (StepDropsInput, "step = parallel: step 0 differs from the parallel form by"),
    (StateOffByOne, "declared state size = actual: state_elements(16) = 5 but "
                    "initial_state holds 4 real numbers per sequence"),
    (NaNGradient, "gradients finite: a non-finite gradient w.r.t. the input"),
    (WrongReference, "gradients equal the float64 reference 'sequential': the gradient "
                     "w.r.t. parameter 'w' differs by"),
    (DecayOverflow, "bfloat16 finite at long length: non-finite outputs from position"),
])
def test_a_broken_rule_is_one_line_naming_it_and_the_deviation(cls, needle):
    with pytest.raises(contract.ContractError) as e:
        contract.check_mixer(cls, cls.__name__, 4, True)
    line = str(e.value)
    assert "\n" not in line and f"config.model.mixer={cls.__name__!r} breaks" in line, line
    assert needle in line, line


def test_the_correct_user_mixer_passes_with_its_reference_and_state():
    contract.check_mixer(CumSum, "CumSum", 4, True)
    contract.check_mixer(CumSum, "CumSum", 4, False)  # bidirectional: no step rules


def test_padding_deviation_is_measured():
    """The reported deviation is the real one: padded inputs are 10·N(0, 1) junk, so a running
    sum over them moves real outputs by O(10)."""
    with pytest.raises(contract.ContractError) as e:
        contract.check_mixer(ReadsPadding, "ReadsPadding", 4, True)
    dev = float(str(e.value).split("changed by ")[1].split()[0])
    assert 1.0 < dev < 200.0
