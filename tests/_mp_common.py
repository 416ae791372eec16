"""Shared helpers of the engine tests: small batches per objective and a model builder.

`build(head_cfg, **model_overrides)` uses `sptlib.models.build_model` with a tiny
`model_config()` when the model zoo provides it, and otherwise a minimal Linen model (below)
that follows the same contract (docs/architecture.md: `encoder`/`backbone`/`head` parameter
collections, logical axis names, `model.apply(variables, inputs, mask, *, deterministic,
inputs2, mask2)`).
"""

import numpy as np
from flax import linen as nn
import jax.numpy as jnp

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


# ------------------------------------------------------------------ fallback model
def _dense(features, names, name=None):
    return nn.Dense(features, name=name,
                    kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                             names),
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros, names[-1:]))


class _Encoder(nn.Module):
    kind: str
    vocab_size: int
    d_model: int

    @nn.compact
    def __call__(self, x):
        if self.kind == "token":
            emb = self.param("embedding", nn.with_logical_partitioning(
                nn.initializers.normal(1.0), ("vocab", "embed")), (self.vocab_size, self.d_model))
            return jnp.take(emb, x, axis=0)
        return _dense(self.d_model, ("norm", "embed"))(x)


class _Backbone(nn.Module):
    d_model: int
    norm: str
    dropout: float

    @nn.compact
    def __call__(self, x, mask, deterministic):
        m = mask[..., None].astype(x.dtype)
        # Causal running mean: a cheap sequence mixer usable by both masked and causal SPT.
        decay = self.param("log_dt", nn.with_logical_partitioning(
            nn.initializers.constant(-1.0), ("ssm_channels",)), (self.d_model,))
        h = x * m
        mixed = jnp.cumsum(h, axis=1) / jnp.maximum(jnp.cumsum(m, axis=1), 1.0)
        y = x + jnp.exp(decay) * mixed
        z = _dense(2 * self.d_model, ("embed", "mlp"))(y)
        z = nn.Dropout(self.dropout)(nn.gelu(z), deterministic=deterministic)
        y = y + _dense(self.d_model, ("mlp", "embed"))(z)
        if self.norm == "batch":
            return nn.BatchNorm(use_running_average=deterministic, axis_name=None)(y)
        return nn.LayerNorm(scale_init=nn.with_logical_partitioning(
            nn.initializers.ones, ("norm",)), bias_init=nn.with_logical_partitioning(
                nn.initializers.zeros, ("norm",)))(y)


class _Head(nn.Module):
    cfg: dict
    d_input: int

    @nn.compact
    def __call__(self, x, mask, x2=None, mask2=None):
        kind = self.cfg["kind"]

        def pool(h, m):
            m = m[..., None].astype(h.dtype)
            return jnp.sum(h * m, 1) / jnp.maximum(jnp.sum(m, 1), 1.0)

        if kind == "classify":
            return _dense(self.cfg["num_classes"], ("embed", "classes"))(pool(x, mask))
        if kind == "retrieval":
            u, v = pool(x, mask), pool(x2, mask2)
            return _dense(self.cfg["num_classes"], ("embed", "classes"))(
                jnp.concatenate([u, v, u * v, u - v], -1))
        if kind == "token_logits":
            return _dense(self.cfg["num_outputs"], ("embed", "vocab"))(x)
        if kind == "pixel_logits":
            y = _dense(self.d_input * 256, ("embed", "vocab"))(x)
            return y.reshape(x.shape[:2] + (self.d_input, 256))
        if kind == "regress":
            return _dense(self.d_input, ("embed", "norm"))(x)
        raise ValueError(kind)


class TinyModel(nn.Module):
    """Minimal contract-following model (used only when build_model is unavailable)."""
    head_cfg: dict
    encoder: str = "token"
    vocab_size: int = VOCAB
    d_model: int = D_MODEL
    d_input: int = 1
    norm: str = "layer"
    dropout: float = 0.0

    def setup(self):
        self.enc = _Encoder(self.encoder, self.vocab_size, self.d_model, name="encoder")
        self.body = _Backbone(self.d_model, self.norm, self.dropout, name="backbone")
        self.out = _Head(dict(self.head_cfg), self.d_input, name="head")

    def __call__(self, inputs, mask, *, deterministic=True, inputs2=None, mask2=None):
        x = self.body(self.enc(inputs), mask, deterministic)
        x2 = None if inputs2 is None else self.body(self.enc(inputs2), mask2, deterministic)
        return self.out(x, mask, x2, mask2)


def real_models_available():
    try:
        from sptlib.models import build_model  # noqa: F401  pylint: disable=import-outside-toplevel
        return True
    except ImportError:
        return False


_MIXER = []


def default_mixer():
    """"s4d" (an SSM, so the optimizer's SSM group is exercised) when the zoo builds it."""
    if not _MIXER:
        try:
            import jax  # pylint: disable=import-outside-toplevel
            from sptlib.models import build_model  # pylint: disable=import-outside-toplevel
            model = build_model(tiny_model_config(mixer="s4d"), {"kind": "classify",
                                                                 "num_classes": 2})
            b = token_batch(batch=2)
            jax.eval_shape(lambda r: model.init(r, b["inputs"], b["mask"]),
                           jax.random.PRNGKey(0))
            _MIXER.append("s4d")
        except Exception:  # pylint: disable=broad-except
            _MIXER.append("attention")
    return _MIXER[0]


def tiny_model_config(continuous=False, d_input=1, mask_channel=False, norm="layer",
                      dropout=0.0, mixer=None, causal=False):
    from sptlib.models.config import model_config  # pylint: disable=import-outside-toplevel
    c = model_config()
    c.mixer = mixer or default_mixer()
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
    # Only options every S4D version accepts (the zoo renamed `init` to `init_kind`).
    c.s4d = type(c.s4d)({"d_state": 8})
    c.attention.n_heads = 2
    return c


def build(head_cfg, *, continuous=False, d_input=1, mask_channel=False, norm="layer",
          dropout=0.0, causal=False, mixer=None, force_tiny=False):
    """Returns `(model, model_cfg)` for a head; the real zoo when it exists."""
    if not force_tiny and real_models_available():
        from sptlib.models import build_model  # pylint: disable=import-outside-toplevel
        model_cfg = tiny_model_config(continuous, d_input, mask_channel, norm, dropout,
                                      mixer=mixer, causal=causal)
        return build_model(model_cfg, head_cfg), model_cfg
    model = TinyModel(head_cfg=dict(head_cfg), encoder="linear" if continuous else "token",
                      d_input=d_input, norm=norm, dropout=dropout)
    return model, None
