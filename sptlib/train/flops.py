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
