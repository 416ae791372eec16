"""Shared helpers of the engine tests: small batches per objective and a tiny real model.

`build(head_cfg, ...)` is `sptlib.models.build_model` on a 1-layer, width-16 `model_config()`.
"""

import numpy as np

from sptlib.models import build_model
from sptlib.models.config import model_config

VOCAB = 12
LENGTH = 16
D_MODEL = 16


def token_batch(batch=8, length=LENGTH, vocab=VOCAB, seed=0, pair=False, n_classes=3):
    """Token batch with ragged lengths, one padded filler example."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(length // 2, length + 1, size=batch)
    mask = np.arange(length)[None, :] < lengths[:, None]
    inputs = np.where(mask, rng.integers(2, vocab, size=(batch, length)), 0).astype(np.int32)
    out = {"inputs": inputs, "mask": mask,
           "label": rng.integers(0, n_classes, size=batch).astype(np.int32),
           "example_mask": np.arange(batch) < batch - 1}
    if pair:
        lengths2 = rng.integers(length // 2, length + 1, size=batch)
        mask2 = np.arange(length)[None, :] < lengths2[:, None]
        out["inputs2"] = np.where(mask2, rng.integers(2, vocab, size=(batch, length)),
                                  0).astype(np.int32)
        out["mask2"] = mask2
    return out


def pixel_batch(batch=8, length=LENGTH, channels=1, seed=0, n_classes=3):
    """Continuous batch: normalised pixels `inputs` and raw values `raw`."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(batch, length, channels)).astype(np.int32)
    return {"inputs": (raw / 255.0 - 0.5).astype(np.float32), "raw": raw,
            "mask": np.ones((batch, length), bool),
            "label": rng.integers(0, n_classes, size=batch).astype(np.int32),
            "example_mask": np.arange(batch) < batch - 1}


def tiny_model_config(continuous=False, d_input=1, mask_channel=False, norm="layer",
                      dropout=0.0, mixer="s4d", causal=False):
    """A 1-layer, width-16 `config.model` (S4D by default, so the SSM optimizer group is used)."""
    c = model_config()
    c.mixer = mixer
    c.d_model = D_MODEL
    c.n_layers = 1
    c.causal = causal
    c.dropout = dropout
    c.norm = norm
    c.encoder = "linear" if continuous else "token"
    c.vocab_size = 0 if continuous else VOCAB
    c.d_input = d_input
    c.mask_channel = mask_channel
    c.max_length = LENGTH
    c.s4d.d_state = 8
    c.attention.n_heads = 2
    return c


def build(head_cfg, *, continuous=False, d_input=1, mask_channel=False, norm="layer",
          dropout=0.0, causal=False, mixer="s4d"):
    """Returns `(model, model_cfg)`: `sptlib.models.build_model` on `tiny_model_config`."""
    model_cfg = tiny_model_config(continuous, d_input, mask_channel, norm, dropout,
                                  mixer=mixer, causal=causal)
    return build_model(model_cfg, head_cfg), model_cfg
