"""`build_model(config.model, head)`: encoder -> backbone -> head as one Linen module.

The module's top-level parameter collections are exactly `encoder`, `backbone` and `head`, so
finetuning can load everything but `head`.
"""

import ast
import difflib
from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from sptlib import layers
from sptlib.errors import ConfigError
from sptlib.layers import MIXERS, contract, get_mixer, initializers
from sptlib.layers import state as state_lib
from sptlib.layers.blocks import BlockConfig
from sptlib.models.backbone import Backbone
from sptlib.models.bow import BagOfWords
from sptlib.models.config import resolve_dtype
from sptlib.models.encoders import LinearEncoder, TokenEncoder
from sptlib.models.heads import ClassifyHead, PixelHead, RetrievalHead, TokenHead

PATTERNS = ("uniform", "gss_hybrid", "wide_attention", "bow")
HEADS = ("classify", "token_logits", "pixel_logits", "regress", "retrieval")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def compute_dtype(model_cfg):
    """The jnp compute dtype of `config.model.dtype` (a stage's model config has it resolved for
    its mesh's devices, `sptlib.train.resolve`; ``auto`` left here: `resolve_dtype`'s default)."""
    return DTYPES[resolve_dtype(model_cfg.dtype)]


def _as_dict(cfg):
    if cfg is None:
        return {}
    return cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)


def _with_dtype(mixer, options, dtype, scheme):
    """`options` plus the compute dtype and the dense projections' `init_scheme` where the
    mixer takes them (and its own options do not set them)."""
    fields = getattr(get_mixer(mixer), "__dataclass_fields__", {})
    extra = {k: v for k, v in (("dtype", dtype), ("init_scheme", scheme))
             if k in fields and k not in options}
    return dict(options, **extra)


def _freeze(options):
    """Mapping -> sorted tuple of items (hashable module attribute)."""
    return tuple(sorted(options.items()))


def block_config(model_cfg) -> BlockConfig:
    """The `BlockConfig` shared by every block of `model_cfg` (`config.model`): the one place
    where the config's block fields become module attributes."""
    c = model_cfg
    return BlockConfig(d_model=c.d_model, causal=c.causal, dropout=c.dropout, norm=c.norm,
                       prenorm=c.prenorm, ffn_mult=c.ffn_mult,
                       dtype=compute_dtype(c),
                       init_scheme=c.init_scheme,
                       gelu_approximate=c.gelu_approximate,
                       tie_dropout=c.tie_dropout,
                       ffn=c.get("ffn", "gelu"))


def _split_top(text):
    """`text` split at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word: a string option (e.g. impl=local)


def _parse_token(token, key):
    """`name`, `name*k` or `name(opt=value, ...)*k` -> (name, {opt: value}, k)."""
    body, times = token.strip(), 1
    if "*" in body.rsplit(")", 1)[-1]:
        body, _, count = body.rpartition("*")
        if not count.strip().isdigit() or int(count) < 1:
            raise ConfigError(f"{key}: {token.strip()!r}: the repeat count after '*' must be a "
                              f"positive integer")
        times = int(count)
    body = body.strip()
    opts = {}
    if body.endswith(")") and "(" in body:
        body, _, args = body[:-1].partition("(")
        for item in filter(str.strip, _split_top(args)):
            k, eq, v = item.partition("=")
            if not eq or not k.strip().isidentifier():
                raise ConfigError(f"{key}: {token.strip()!r}: options are written "
                                  f"name(option=value, ...), got {item.strip()!r}")
            opts[k.strip()] = _value(v.strip())
    return body.strip(), opts, times


def _check_layer_mixer(name, key):
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{key}: a layer's mixer must be a name, got {name!r}")
    if layers.is_user_mixer(name) or name in MIXERS:
        layers.check_mixer_name(name, key)
        return
    close = difflib.get_close_matches(name, sorted(MIXERS), n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(f"{key}: unknown mixer {name!r} ({hint}valid: {', '.join(sorted(MIXERS))}, "
                      f"or an import path 'package.module:Class')")


def _check_options(name, opts, key):
    """Every per-layer option is a constructor field of the mixer (zoo mixers; a user's class
    is checked by its contract)."""
    fields = set(getattr(get_mixer(name), "__dataclass_fields__", {})) - {
        "parent", "name", "d_model", "causal", "dropout"}
    for k in opts:
        if k not in fields:
            close = difflib.get_close_matches(k, sorted(fields), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"{key}: mixer {name!r} takes no option {k!r} ({hint}its options: "
                              f"{', '.join(sorted(fields))})")


def pattern_unit(spec, key="config.model.layers"):
    """The layers of one repeat of a pattern string: `"s4d*2,attention"` ->
    `[("s4d", {}), ("s4d", {}), ("attention", {})]` (names not checked here)."""
    unit = []
    for token in _split_top(spec):
        if not token.strip():
            raise ConfigError(f"{key}={spec!r}: an empty entry (write e.g. 's4d*3,attention')")
        name, opts, times = _parse_token(token, key)
        unit += [(name, opts)] * times
    return unit


def _layer_list(model_cfg):
    """`config.model.layers` -> `[(name, per-layer options), ...]` of length n_layers.

    A string is a pattern, `"gated_deltanet*3,attention"` (per-layer options as
    `attention(n_heads=8)`), repeated to `n_layers` (its length must divide it); a list/tuple
    gives every layer, each a name or a mapping `{"mixer": name, **options}`.
    """
    c, key = model_cfg, "config.model.layers"
    spec = c.layers
    n = int(c.n_layers)
    if isinstance(spec, str):
        unit = pattern_unit(spec)
        if n % len(unit):
            raise ConfigError(f"{key}={spec!r} is a unit of {len(unit)} layers, which does not "
                              f"divide config.model.n_layers={n}")
        entries = unit * (n // len(unit))
    else:
        entries = []
        for item in spec:
            item = _as_dict(item) if not isinstance(item, str) else {"mixer": item}
            opts = dict(item)
            entries.append((opts.pop("mixer", None), opts))
        if len(entries) != n:
            raise ConfigError(f"{key}: a list of {len(entries)} layers, but "
                              f"config.model.n_layers={n} (a list gives every layer; a pattern "
                              f"string repeats)")
    for i, (name, opts) in enumerate(entries):
        _check_layer_mixer(name, f"{key} (layer {i})")
        _check_options(name, opts, f"{key} (layer {i})")
    return entries


def layer_specs(model_cfg):
    """`((mixer, options), ...)`, one per layer, for `model_cfg.layers` or `model_cfg.pattern`.

    `layers` (a free hybrid stack; `_layer_list`) takes each mixer's options from
    `config.model.<mixer>` with the layer's own on top. Patterns: gss_hybrid puts an attention
    block at layers 1, 5, 9, … (every 4th starting at the 2nd; GSS paper) and GSS blocks
    elsewhere (= `layers="gss,attention,gss,gss"` where 4 divides n_layers); wide_attention is
    one attention block with `n_layers · n_heads` heads of the deep model's head width.
    """
    c = model_cfg
    dtype = compute_dtype(c)
    attention = dict(_as_dict(c.attention), dtype=dtype,
                     init_scheme=c.init_scheme)
    options = lambda name: attention if name == "attention" else _with_dtype(
        name, _as_dict(c.get(name)), dtype, c.init_scheme)
    if c.get("layers"):
        if c.pattern != "uniform":
            raise ConfigError(f"config.model.layers={c.layers!r} and "
                              f"config.model.pattern={c.pattern!r}: set one (layers replaces "
                              f"the pattern; leave pattern='uniform')")
        return tuple((name, _freeze(dict(options(name), **opts)))
                     for name, opts in _layer_list(c))
    if c.pattern == "uniform":
        return ((c.mixer, _freeze(options(c.mixer))),) * c.n_layers
    if c.pattern == "gss_hybrid":
        return tuple(("attention", _freeze(attention)) if i % 4 == 1
                     else ("gss", _freeze(options("gss"))) for i in range(c.n_layers))
    if c.pattern == "bow":
        return ()
    if c.pattern == "wide_attention":
        wide = dict(attention, n_heads=c.n_layers * attention["n_heads"],
                    head_dim=attention.get("head_dim") or c.d_model // attention["n_heads"])
        return (("attention", _freeze(wide)),)
    raise ValueError(f"pattern {c.pattern!r} not in {PATTERNS}")


class SequenceModel(nn.Module):
    """encoder -> backbone -> head.

    `model.apply(variables, inputs, mask, *, deterministic=True, inputs2=None, mask2=None)`:
    inputs int `[batch, length]` or float `[batch, length, d_features]`, mask bool
    `[batch, length]` (True = real; None = all real); `inputs2`/`mask2` the second document of a
    retrieval pair. Returns the head's output (see `sptlib.models.heads`).
    """
    encoder: nn.Module
    backbone: nn.Module
    head: nn.Module
    head_kind: str = "classify"

    def features(self, inputs, mask=None, *, deterministic=True):
        """Backbone features `[batch, length, d_model]` (zero at padding)."""
        return self.backbone(self.encoder(inputs), mask, deterministic=deterministic)

    def __call__(self, inputs, mask=None, *, deterministic=True, inputs2=None, mask2=None):
        if self.head_kind != "retrieval":
            return self.head(self.features(inputs, mask, deterministic=deterministic), mask)
        if inputs2 is None:
            raise ValueError("the retrieval head needs inputs2 (the second document)")
        batch = inputs.shape[0]
        ones = lambda x: jnp.ones(x.shape[:2], bool)
        mask = ones(inputs) if mask is None else mask
        mask2 = ones(inputs2) if mask2 is None else mask2
        if inputs.shape == inputs2.shape:
            # One pass over both documents: one backbone call, shared batch statistics.
            both = self.features(jnp.concatenate([inputs, inputs2]),
                                 jnp.concatenate([mask, mask2]), deterministic=deterministic)
            x1, x2 = both[:batch], both[batch:]
        else:
            x1 = self.features(inputs, mask, deterministic=deterministic)
            x2 = self.features(inputs2, mask2, deterministic=deterministic)
        return self.head(x1, mask, x2, mask2)


def check_mixer(model_cfg) -> None:
    """`config.model.mixer` is a zoo mixer, or the user's (by import path) keeping the mixer
    contract (`sptlib.layers.contract`) at the model's width and causality; else a one-line
    `ConfigError` naming the broken rule. The trainer's preflight calls it before any step."""
    c = model_cfg
    try:
        if not c.get("layers"):
            layers.check_mixer_name(c.mixer)
        for name, options in sorted(set(layer_specs(c)), key=repr):
            if layers.is_user_mixer(name):
                contract.check_mixer(get_mixer(name), name, int(c.d_model), bool(c.causal),
                                     options)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def model_state_size(model_cfg, length=None, dtype=jnp.float32) -> state_lib.StateSize:
    """Recurrent state per sequence of the whole backbone at sequence `length`: the sum over
    `layer_specs(model_cfg)` of `sptlib.layers.state.state_size` of each layer's mixer, built
    causal (the decoding state; a bidirectional model runs the same recurrence once per
    direction). `bytes` at `dtype`. Raises ValueError for a mixer that declares no state."""
    c = model_cfg if isinstance(model_cfg, ml_collections.ConfigDict) else \
        ml_collections.ConfigDict(model_cfg)
    total = state_lib.StateSize(0, 0)
    if c.pattern == "bow":
        return total
    for name, options in layer_specs(c):
        total = total + state_lib.state_size(name, d_model=int(c.d_model), causal=True,
                                             options=options, length=length, dtype=dtype)
    return total


def build_model(model_cfg, head_cfg: Mapping[str, Any]):
    """Builds the `SequenceModel` for `model_cfg` (`config.model`) and `head_cfg`.

    head_cfg: `kind` in classify | token_logits | pixel_logits | regress | retrieval, with
    `num_classes` (classify, retrieval) or `num_outputs` (token_logits; default
    `model_cfg.vocab_size`); optional `pooling` (default `model_cfg.pooling`).
    """
    c = model_cfg if isinstance(model_cfg, ml_collections.ConfigDict) else \
        ml_collections.ConfigDict(model_cfg)
    h = _as_dict(head_cfg)
    dtype = compute_dtype(c)
    scheme = c.init_scheme
    initializers.check(scheme)
    if c.encoder == "token":
        if c.vocab_size <= 0:
            raise ValueError("model.vocab_size must be set (from task.info['vocab_size'])")
        encoder = TokenEncoder(c.vocab_size, c.d_model, c.positions, c.max_length)
    elif c.encoder == "linear":
        encoder = LinearEncoder(c.d_input + int(bool(c.mask_channel)), c.d_model, c.positions,
                                c.max_length, dtype, scheme)
    else:
        raise ValueError(f"encoder {c.encoder!r} not in ('token', 'linear')")
    bow = c.pattern == "bow"
    if not bow:  # the user's mixer keeps the contract, or one line says why
        check_mixer(c)
    if bow:  # the bag-of-words control (sptlib.models.bow): no mixing, an MLP head
        backbone = BagOfWords(nonlinear=c.encoder == "linear")
    else:
        # `bypass_mixers` (set per stage by `stages.<s>.bypass_mixers`): a per-token network.
        backbone = Backbone(layer_specs(c), block_config(c), c.scan_layers,
                            c.remat, bool(c.get("bypass_mixers", False)),
                            c.scan_unroll, c.remat_policy)
    kind = h.get("kind")
    pooling = h.get("pooling", c.pooling)
    if kind == "classify":
        head = ClassifyHead(h["num_classes"], pooling, scheme,
                            c.d_model if bow else c.head_hidden,
                            "gelu" if bow else c.head_activation)
    elif kind == "token_logits":
        head = TokenHead(h.get("num_outputs") or c.vocab_size, init_scheme=scheme)
    elif kind == "pixel_logits":
        head = PixelHead(c.d_input, init_scheme=scheme)
    elif kind == "regress":
        head = TokenHead(c.d_input, axis_name="classes", init_scheme=scheme)
    elif kind == "retrieval":
        head = RetrievalHead(h["num_classes"], pooling, init_scheme=scheme,
                             gelu_approximate=c.gelu_approximate)
    else:
        raise ValueError(f"head kind {kind!r} not in {HEADS}")
    return SequenceModel(encoder, backbone, head, kind)
