"""FLOPs of one step, counted from the traced program with every loop's trip count.

XLA's `compiled.cost_analysis()` counts the body of a while loop once, so a step whose layers
run under `nn.scan` (or whose attention loops over chunks) reports a fraction of its work. Here
the step's jaxpr is walked instead: matrix products (`dot_general`), convolutions and FFTs are
counted, a `scan` body `length` times, the larger branch of a `cond`, and remat recomputation
as it is traced (it is executed work). Elementwise operations are not counted (they are a few
per cent of a step of these models and not what a peak FLOP/s rating measures).

    flops = step_flops(train_step, state, batch)   # `state` / `batch` may be ShapeDtypeStructs

`estimate_flops(config, stage, num_params)` is the closed-form estimate from the config alone
(nothing traced): the budget of a whole stage in TPU-v4 hours, for planning (docs/reproducing.md).
"""

import math

import numpy as np

from sptlib import data


def _size(aval) -> int:
    return int(np.prod(aval.shape)) if aval.shape else 1


def _dot_flops(eqn) -> float:
    """2 FLOPs per multiply-add: 2 x output elements x contracted size."""
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval
    return 2.0 * _size(eqn.outvars[0].aval) * math.prod(lhs.shape[d] for d in lhs_contract)


def _conv_flops(eqn) -> float:
    rhs = eqn.invars[1].aval
    out_feature_dim = eqn.params["dimension_numbers"].rhs_spec[0]
    per_output = _size(rhs) // rhs.shape[out_feature_dim]
    return 2.0 * _size(eqn.outvars[0].aval) * per_output


def _fft_flops(eqn) -> float:
    """5 N log2 N per complex transform of length N (half that for real ones)."""
    lengths = tuple(eqn.params["fft_lengths"])
    n = math.prod(lengths)
    if n <= 1:
        return 0.0
    operand = eqn.invars[0].aval
    batch = _size(operand) // max(1, math.prod(operand.shape[-len(lengths):]))
    real = "R" in str(eqn.params["fft_type"]).upper()
    return 5.0 * n * math.log2(n) * batch * (0.5 if real else 1.0)


_COUNTERS = {"dot_general": _dot_flops, "conv_general_dilated": _conv_flops, "fft": _fft_flops}


def _subjaxprs(value):
    """Jaxprs held by an equation parameter (a Jaxpr, a ClosedJaxpr, or tuples of them)."""
    if hasattr(value, "eqns"):
        return [value]
    if hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
        return [value.jaxpr]
    if isinstance(value, (tuple, list)):
        return [j for v in value for j in _subjaxprs(v)]
    return []


def jaxpr_flops(jaxpr) -> float:
    """FLOPs of a jaxpr (see the module docstring)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in _COUNTERS:
            total += _COUNTERS[name](eqn)
        elif name == "cond":
            total += max((jaxpr_flops(j) for j in _subjaxprs(eqn.params["branches"])),
                         default=0.0)
        else:
            inner = sum(jaxpr_flops(j) for v in eqn.params.values() for j in _subjaxprs(v))
            total += inner * (int(eqn.params["length"]) if name == "scan" else 1)
    return total


def step_flops(step, *args) -> float:
    """FLOPs of one call of a `sptlib.train.steps` step function on `args` (arrays or
    `ShapeDtypeStruct`s); traced only, nothing is compiled or run."""
    return jaxpr_flops(step.trace(*args).jaxpr.jaxpr)


# ------------------------------------------------------------------------------------------------
# Closed-form estimate of a whole stage from the config alone (docs/reproducing.md).
# ------------------------------------------------------------------------------------------------

TPU_V4_PEAK_FLOPS = 275e12  # bf16 per chip
DEFAULT_MFU = 0.3  # assumed utilisation; long-sequence models rarely do better


def estimate_flops(config, stage: str, num_params: int) -> dict:
    """Training FLOPs of one stage: 6 · params · tokens for the dense layers, plus attention's
    L² term (window-limited) or the SSMs' FFT convolutions.

    Returns {flops, tokens, tpu_v4_hours (at DEFAULT_MFU), seq_len}.
    """
    st = config.stages[stage]
    m = config.model
    L = data.sequence_length(config.data)
    docs = 2 if config.data.task == "retrieval" else 1
    tokens = st.num_steps * st.batch_size * L * docs
    flops = 6.0 * num_params * tokens
    n_attn = 0
    if m.mixer == "attention":
        n_attn = m.n_layers
    elif m.pattern == "gss_hybrid":
        n_attn = len(range(1, m.n_layers, 4))
    if st.get("bypass_mixers", False):
        n_attn = 0  # mlpinit's stage 1: no mixer runs (num_params is then the per-token model's)
    span = min(L, 2 * m.attention.window) if m.attention.window else L
    # QK^T and AV: 2 matmuls × 2 FLOPs per MAC × span × d per token, ×3 for the backward pass.
    flops += 3 * 4.0 * span * m.d_model * tokens * n_attn
    n_ssm = m.n_layers - n_attn if m.mixer != "attention" else 0
    n_ssm = 0 if st.get("bypass_mixers", False) else n_ssm
    if n_ssm:
        # rfft / irfft of length 2L per channel (~5 · 2L · log2 2L each, 3 transforms), ×3 bwd.
        fft = 3 * 5.0 * 2 * math.log2(2 * L) * 3
        width = m.d_model if m.mixer != "gss" else max(m.d_model // 4, 1)
        flops += fft * width * tokens * n_ssm * (2 if not m.causal else 1)
    hours = flops / (TPU_V4_PEAK_FLOPS * DEFAULT_MFU) / 3600.0
    return {"flops": flops, "tokens": tokens, "tpu_v4_hours": hours, "seq_len": L}


# ------------------------------------------------------------------------------------------------
# Model FLOPs (PaLM's count): the useful work of a step, whatever the kernels or remat do.
# ------------------------------------------------------------------------------------------------

# Parameters read by a lookup, not a matmul: token embeddings (`nn.Embed`) and learned positions.
EMBEDDING_PARAMS = ("embedding", "positions")


def attended_pairs(length: int, *, causal: bool = False, window: int = 0) -> int:
    """(query, key) pairs one attention head scores in a sequence of `length`: L² bidirectional,
    L(L+1)/2 causal, and for a local window only the band (|i - j| <= window; 0 <= i - j <=
    window when causal)."""
    n, w = int(length), int(window)
    if w <= 0 or w >= n - 1:
        return n * (n + 1) // 2 if causal else n * n
    # Row i sees min(i, w) keys behind it (and min(n - 1 - i, w) ahead when bidirectional).
    behind = w * (w - 1) // 2 + (n - w) * w  # sum over i of min(i, w)
    return n + behind if causal else n + 2 * behind


def non_embedding_params(params) -> int:
    """Parameter count less the lookup tables (EMBEDDING_PARAMS): what a token's matmuls use."""
    import jax  # deferred: the closed-form estimates above need no JAX

    total = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
        if not any(k in EMBEDDING_PARAMS for k in keys):
            total += int(np.prod(leaf.shape))
    return total


def model_flops(*, params: int, sequences: int, length: int, attention_layers: int = 0,
                attention_width: int = 0, causal: bool = False, window: int = 0) -> dict:
    """Model FLOPs of one training step as PaLM counts them (Chowdhery et al. 2022, app. B):

        6 · N · tokens + 12 · sequences · attended_pairs · attention_width · attention_layers

    N the non-embedding parameters, tokens = sequences · length (forward 2 and backward 4 FLOPs
    per parameter and token; forward 4 and backward 8 per scored pair and feature for QKᵀ and
    AV). Remat recomputation and masked-out work are not model FLOPs. Returns {model_flops,
    dense_flops, attention_flops, tokens, pairs}."""
    tokens = int(sequences) * int(length)
    pairs = attended_pairs(length, causal=causal, window=window) if attention_layers else 0
    dense = 6.0 * params * tokens
    attn = 12.0 * sequences * pairs * attention_width * attention_layers
    return {"model_flops": dense + attn, "dense_flops": dense, "attention_flops": attn,
            "tokens": tokens, "pairs": pairs}


def stage_model_flops(config, stage: str, model_cfg, params) -> dict:
    """`model_flops` of one training step of a stage as built: `model_cfg` the resolved model
    (`config.model` with data fields filled in), `params` the parameter tree (arrays or
    `ShapeDtypeStruct`s)."""
    m, st = model_cfg, config.stages[stage]
    docs = 2 if config.data.task == "retrieval" else 1
    n_attn = 0
    if m.mixer == "attention" and m.pattern != "bow":
        n_attn = m.n_layers
    elif m.pattern == "gss_hybrid":
        n_attn = len(range(1, m.n_layers, 4))
    if st.get("bypass_mixers", False):
        n_attn = 0
    a = m.attention
    width = int(a.n_heads) * int(a.head_dim or m.d_model // a.n_heads)
    return model_flops(params=non_embedding_params(params), sequences=int(st.batch_size) * docs,
                       length=data.sequence_length(config.data), attention_layers=n_attn,
                       attention_width=width, causal=bool(m.causal),
                       window=int(a.window or 0))
