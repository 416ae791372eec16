"""The plain baselines of the mixer benchmark (`sptlib.bench.mixers`), each timed beside its
optimised path: FFT convolution vs a direct depthwise causal convolution (O(L^2), up to
`direct_max_length`), S5's parallel scan vs the sequential `lax.scan`."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from sptlib.bench import common
from sptlib.kernels import fft_conv, s5_recurrent, s5_scan


def direct_causal_conv(u, k):
    """Direct depthwise causal convolution, the O(L^2) baseline of `fft_conv`.

    u `[batch, length, H]`, k `[H, length]` -> y `[batch, length, H]`,
    y_t = sum_{s<=t} k[:, t-s] u_s, by `lax.conv_general_dilated` with one group per channel.
    """
    length, h = u.shape[1], u.shape[2]
    # conv_general_dilated correlates, so flip the kernel; left padding L-1 makes it causal.
    rhs = k[:, :length][:, ::-1].T[:, None, :]  # [W, I=1, O=H]
    return jax.lax.conv_general_dilated(
        u, rhs, window_strides=(1,), padding=[(length - 1, 0)],
        dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=h,
        precision=jax.lax.Precision.HIGHEST)


def _time_pair(fn, args, s):
    compiled, compile_s = common.compile_timed(fn, *args)
    sec, times, _ = common.time_call(compiled, *args, repeats=s.repeats,
                                     max_seconds=s.max_seconds)
    return sec, common.compiled_peak_bytes(compiled), compile_s, len(times)


def _grad_of(f, argnums):
    return jax.jit(jax.grad(lambda *a: jnp.mean(jnp.square(jnp.abs(f(*a)))), argnums=argnums))


def bench_conv(length, s, kinds):
    """fft_conv vs direct conv at one length: records for both and a ratio per kind."""
    b, h = s.ssm_batch, s.ssm_d_model
    u = jax.random.normal(jax.random.PRNGKey(2), (b, length, h), jnp.float32)
    k = jax.random.normal(jax.random.PRNGKey(3), (h, length), jnp.float32) / math.sqrt(length)
    impls = {"fft_conv": lambda u, k: fft_conv(u, k), "direct_conv": direct_causal_conv}
    out = []
    for kind in kinds:
        secs = {}
        for name, f in impls.items():
            if name == "direct_conv" and length > s.direct_max_length:
                continue
            fn = jax.jit(f) if kind == "forward" else _grad_of(f, (0, 1))
            sec, peak, cs, n = _time_pair(fn, (u, k), s)
            secs[name] = sec
            out.append({"name": name, "kind": kind, "length": length, "batch": b, "channels": h,
                        "seconds": sec, "tokens_per_s": b * length / sec, "peak_bytes": peak,
                        "compile_s": round(cs, 3), "repeats": n,
                        "memory_method": "xla_memory_analysis"})
        if len(secs) == 2:
            out.append(ratio("fft_conv_vs_direct_conv", kind, length, secs["direct_conv"],
                              secs["fft_conv"]))
    return out


def bench_scan(length, s, kinds):
    """S5 parallel scan vs sequential lax.scan at one length (complex64 [batch, L, P/2])."""
    b, p2 = s.ssm_batch, s.ssm_d_state // 2
    key_a, key_b = jax.random.split(jax.random.PRNGKey(4))
    r = jnp.exp(-jnp.exp(jax.random.uniform(key_a, (p2,), minval=-6.0, maxval=-2.0)))
    lam = r * jnp.exp(1j * jax.random.uniform(key_b, (p2,), maxval=np.pi)).astype(jnp.complex64)
    lam = lam.astype(jnp.complex64)
    bu = jax.lax.complex(*jax.random.normal(jax.random.PRNGKey(5), (2, b, length, p2)))
    impls = {"s5_parallel_scan": s5_scan, "s5_sequential_scan": s5_recurrent}
    out = []
    for kind in kinds:
        secs = {}
        for name, f in impls.items():
            fn = jax.jit(f) if kind == "forward" else _grad_of(
                lambda lam, re, im, f=f: f(lam, jax.lax.complex(re, im)), (1, 2))
            args = (lam, bu) if kind == "forward" else (lam, bu.real, bu.imag)
            sec, peak, cs, n = _time_pair(fn, args, s)
            secs[name] = sec
            out.append({"name": name, "kind": kind, "length": length, "batch": b,
                        "state": p2, "seconds": sec, "tokens_per_s": b * length / sec,
                        "peak_bytes": peak, "compile_s": round(cs, 3), "repeats": n,
                        "memory_method": "xla_memory_analysis"})
        out.append(ratio("s5_parallel_vs_sequential_scan", kind, length,
                          secs["s5_sequential_scan"], secs["s5_parallel_scan"]))
    return out


def ratio(name, kind, length, baseline_s, optimised_s, **extra):
    return {"name": name, "kind": "ratio", "of_kind": kind, "length": length,
            "baseline_seconds": baseline_s, "seconds": optimised_s,
            "speedup": baseline_s / optimised_s, **extra}
