"""The user's own mixer and task builder by import path: the mixer contract (each broken rule is
one line naming it), the SSM-group marking, and import paths that do not resolve."""

import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib import api, errors
from sptlib.data import data_config, get_task, task_info
from sptlib.layers import param_groups
from sptlib.models import build, config as model_config

MIXERS = textwrap.dedent('''
    import flax.linen as nn
    import jax.numpy as jnp
    from sptlib.api import ssm_param


    class CumMean(nn.Module):
        """Causal-capable: running mean (causal) or global mean, then a dense map."""
        d_model: int
        causal: bool = False
        dropout: float = 0.0

        @nn.compact
        def __call__(self, x, *, mask=None, deterministic=True):
            gate = self.param("gate", ssm_param(nn.initializers.ones, ("embed",)),
                              (self.d_model,))
            if mask is not None:  # what the padding holds never reaches a real position
                x = jnp.where(mask[..., None], x, 0.0)
            if self.causal:
                y = jnp.cumsum(x, 1) / jnp.arange(1, x.shape[1] + 1)[None, :, None]
            else:
                y = jnp.broadcast_to(x.mean(1, keepdims=True), x.shape)
            return nn.Dense(self.d_model)(y * gate)


    class Leaky(CumMean):
        """Claims causal but mixes in the last position."""
        @nn.compact
        def __call__(self, x, *, mask=None, deterministic=True):
            return x + x[:, -1:, :]


    class Narrow(CumMean):
        @nn.compact
        def __call__(self, x, *, mask=None, deterministic=True):
            return nn.Dense(self.d_model // 2)(x)


    class NoMask(CumMean):
        @nn.compact
        def __call__(self, x, deterministic=True):
            return x


    class NoCausal(nn.Module):
        d_model: int
        dropout: float = 0.0

        def __init__(self, d_model, causal, dropout):
            object.__setattr__(self, "d_model", d_model)
            object.__setattr__(self, "dropout", dropout)
            super().__init__()

        def __call__(self, x, *, mask=None, deterministic=True):
            return x
''')

TASKS = textwrap.dedent('''
    import numpy as np
    from sptlib.data import sources
    from sptlib.data.defaults import info
    from sptlib.data.registry import Task


    def build(cfg):
        rng = np.random.default_rng(0)
        seqs = [rng.integers(0, 5, 8) for _ in range(32)]
        labels = [int(s.sum() % 2) for s in seqs]
        return Task(cfg, info("parity", vocab_size=7, num_classes=2, max_length=8,
                              input_type="tokens"),
                    lambda split: sources.TokenSource(seqs, labels, 8, id_offset=2))


    not_a_function = 3
''')


@pytest.fixture(scope="module")
def user_pkg(tmp_path_factory):
    root = tmp_path_factory.mktemp("user")
    (root / "my_pkg").mkdir()
    (root / "my_pkg" / "__init__.py").write_text("")
    (root / "my_pkg" / "mixers.py").write_text(MIXERS)
    (root / "my_pkg" / "tasks.py").write_text(TASKS)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))


def _model_cfg(mixer, causal=False):
    m = model_config.model_config()
    m.update(mixer=mixer, pattern="uniform", d_model=8, n_layers=2, vocab_size=10,
             max_length=16, causal=causal)
    return m


def test_user_mixer_trains_in_a_model_and_marks_ssm_parameters(user_pkg):
    for causal in (False, True):
        build.check_mixer(_model_cfg("my_pkg.mixers:CumMean", causal))
    model = build.build_model(_model_cfg("my_pkg.mixers:CumMean"), {"kind": "classify",
                                                                    "num_classes": 3})
    x = jnp.ones((2, 16), jnp.int32)
    # As the trainer reads them: abstract parameters (plain ones of nn.Dense stay "default").
    variables = param_groups.unbox_abstract(jax.eval_shape(
        lambda: model.init(jax.random.PRNGKey(0), x, jnp.ones((2, 16), bool))))
    labels = api.param_labels(variables["params"])
    flat = {"/".join(str(getattr(k, "key", k)) for k in path): v
            for path, v in jax.tree_util.tree_flatten_with_path(labels)[0]}
    gates = [k for k in flat if k.endswith("mixer/gate")]
    assert gates and all(flat[k] == "ssm" for k in gates)
    assert all(v == "default" for k, v in flat.items() if not k.endswith("gate"))


@pytest.mark.parametrize("cls,causal,needle", [
    ("Narrow", False, "returned shape (2, 16, 4) for input [batch, length, features] = "
                      "(2, 16, 8)"),
    ("Leaky", True, "causal=True but output position 0 changed"),
    ("NoMask", False, "calling mixer(x[batch, length, features], *, mask=..., "
                      "deterministic=...) failed"),
    ("NoCausal", False, "no `causal` attribute"),
])
def test_broken_contract_is_one_line_naming_the_rule(user_pkg, cls, causal, needle):
    name = f"my_pkg.mixers:{cls}"
    with pytest.raises(errors.ConfigError) as e:
        build.check_mixer(_model_cfg(name, causal))
    line = errors.one_line(e.value)
    assert "\n" not in line and f"config.model.mixer='{name}' breaks the mixer contract" in line
    assert needle in line, line
    with pytest.raises(errors.ConfigError):  # build_model checks too (API users, AOT)
        build.build_model(_model_cfg(name, causal), {"kind": "classify", "num_classes": 2})


def test_leak_is_found_by_perturbing_later_positions():
    """The causal check against an independent truth: a mixer that reads position i+1 leaks; a
    causal convolution over positions <= i does not."""
    class Shift(nn.Module):
        d_model: int
        causal: bool = True
        dropout: float = 0.0
        offset: int = 1

        def __call__(self, x, *, mask=None, deterministic=True):
            if mask is not None:  # padding invariance: what the padding holds never shows
                x = jnp.where(mask[..., None], x, 0.0)
            pad = jnp.zeros_like(x[:, :abs(self.offset)])  # y[i] = x[i + offset], 0 outside
            if self.offset > 0:
                return jnp.concatenate([x[:, self.offset:], pad], axis=1)
            return jnp.concatenate([pad, x[:, :self.offset]], axis=1)
    with pytest.raises(errors.ConfigError, match="output position 7 changed"):  # reads x[8]
        api.check_mixer(Shift, d_model=4, causal=True)
    api.check_mixer(Shift, d_model=4, causal=True, options={"offset": -1})  # x[i - 1]: fine


@pytest.mark.parametrize("path,needle", [
    ("no_such_pkg.mixers:M", "cannot import module 'no_such_pkg.mixers'"),
    ("my_pkg.mixers:Missing", "module 'my_pkg.mixers'"),
    ("my_pkg.mixers:", "expected 'package.module:Class'"),
])
def test_mixer_import_path_that_does_not_resolve(user_pkg, path, needle):
    with pytest.raises(errors.ConfigError) as e:
        build.check_mixer(_model_cfg(path))
    line = errors.one_line(e.value)
    assert line.startswith(f"ConfigError: config.model.mixer={path!r}") and needle in line


def test_user_task_builder_by_import_path(user_pkg):
    c = data_config()
    c.task = "my_pkg.tasks:build"
    assert task_info(c)["name"] == "parity" and task_info(c)["num_classes"] == 2
    batch = next(get_task(c).make_iterator("train", batch_size=4, seed=0))
    assert batch["inputs"].shape == (4, 8) and np.all(batch["inputs"] >= 2)
    for path, needle in (("my_pkg.tasks:nope", "has no 'nope'"),
                         ("my_pkg.tasks:not_a_function", "int is not callable"),
                         ("gone.tasks:build", "cannot import module 'gone.tasks'")):
        c.task = path
        with pytest.raises(errors.SptlibError) as e:
            get_task(c)
        assert needle in errors.one_line(e.value)
