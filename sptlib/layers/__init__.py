"""Flax Linen layers: sequence mixers (attention, SSMs, GSS), norms, feed-forward blocks.

Every sequence mixer follows one contract (see docs/models.md):

    y = mixer(x[batch, length, features], *, mask[batch, length] | None, deterministic: bool)

constructed as ``cls(d_model=..., causal=..., dropout=..., **config.model.<mixer name>)``.
Mixers with a recurrence also offer ``initial_state(batch_size, max_length=None)`` and
``step(x_t[batch, features], state) -> (y_t[batch, features], state)``.

The state-space mixers (`ssm`) and the GSS block (`gss`) compose the kernel modules of
`ssm_kernels` (an SSM's parameters -> its kernel `[n_dir, channels, length]` and recurrence).

The user's own mixer is named by import path, ``config.model.mixer = "my_pkg.mixers:MyMixer"``;
`sptlib.layers.contract` checks it against the contract above before training.
"""

import importlib

from sptlib import import_path

# name -> "module:Class"; resolved lazily so importing sptlib.layers stays cheap.
MIXERS = {
    "attention": "sptlib.layers.attention:MultiHeadAttention",
    "s4": "sptlib.layers.ssm:S4Mixer",
    "s4d": "sptlib.layers.ssm:S4DMixer",
    "dss": "sptlib.layers.ssm:DSSMixer",
    "dlr": "sptlib.layers.ssm:DLRMixer",
    "s5": "sptlib.layers.ssm:S5Mixer",
    # Selective SSMs (input-dependent dt, B, C): sptlib.layers.mamba.
    "mamba": "sptlib.layers.mamba:MambaMixer",
    "mamba2": "sptlib.layers.mamba:Mamba2Mixer",
    # Linear attention / delta rule / mLSTM / RWKV-7 (matrix-valued states): sptlib.layers.linear_rnn.
    "gla": "sptlib.layers.linear_rnn:GLAMixer",
    "retnet": "sptlib.layers.linear_rnn:RetNetMixer",
    "deltanet": "sptlib.layers.linear_rnn:DeltaNetMixer",
    "gated_deltanet": "sptlib.layers.linear_rnn:GatedDeltaNetMixer",
    "mlstm": "sptlib.layers.linear_rnn:MLSTMMixer",
    "rwkv7": "sptlib.layers.linear_rnn:RWKV7Mixer",
    # A whole residual block with the mixer contract; backbones use it without another wrapper.
    "gss": "sptlib.layers.gss:GSSBlock",
    # Implicit long convolutions, gated (Poli et al. 2023): sptlib.layers.hyena.
    "hyena": "sptlib.layers.hyena:HyenaMixer",
}


def is_user_mixer(name) -> bool:
    """Whether `name` is the user's mixer by import path (`package.module:Class`)."""
    return isinstance(name, str) and ":" in name and name not in MIXERS


def _load_user_mixer(path, key="config.model.mixer"):
    """The class at `path`; ValueError naming `key` when it does not resolve."""
    return import_path.load(path, key, kind="Class")


def check_mixer_name(name, key="config.model.mixer") -> None:
    """ValueError unless `name` is a key of MIXERS or an import path that resolves."""
    if is_user_mixer(name):
        _load_user_mixer(name, key)
    elif name not in MIXERS:
        raise ValueError(f"{key}={name!r}: expected one of {', '.join(sorted(MIXERS))}, or "
                         f"the import path of your own mixer ('package.module:Class')")


def get_mixer(name):
    """Returns the mixer class registered under `name` (a key of MIXERS), or the user's class at
    the import path `name` (`package.module:Class`)."""
    if is_user_mixer(name):
        return _load_user_mixer(name)
    if name not in MIXERS:
        raise ValueError(f"unknown mixer {name!r}; known: {sorted(MIXERS)} (or an import path "
                         f"'package.module:Class')")
    module, cls = MIXERS[name].split(":")
    return getattr(importlib.import_module(module), cls)
