"""Flax Linen layers: sequence mixers (attention, SSMs, GSS), norms, feed-forward blocks.

Every sequence mixer follows one contract (see docs/models.md):

    y = mixer(x[batch, length, features], *, mask[batch, length] | None, deterministic: bool)

constructed as ``cls(d_model=..., causal=..., dropout=..., **config.model.<mixer name>)``.
Mixers with a recurrence also offer ``initial_state(batch_size, max_length=None)`` and
``step(x_t[batch, features], state) -> (y_t[batch, features], state)``.

The state-space mixers (`ssm`) and the GSS block (`gss`) compose the kernel modules of
`ssm_kernels` (an SSM's parameters -> its kernel `[n_dir, channels, length]` and recurrence).
"""

import importlib

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
    # A whole residual block with the mixer contract; backbones use it without another wrapper.
    "gss": "sptlib.layers.gss:GSSBlock",
}


def get_mixer(name):
    """Returns the mixer class registered under `name` (a key of MIXERS)."""
    if name not in MIXERS:
        raise ValueError(f"unknown mixer {name!r}; known: {sorted(MIXERS)}")
    module, cls = MIXERS[name].split(":")
    return getattr(importlib.import_module(module), cls)
