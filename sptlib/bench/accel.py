"""The accelerator report: `python -m sptlib.bench --accelerator-report [--tiny]`.

One command that measures, on the device JAX runs on (one GPU is what it is sized for: under
8 minutes there), the tables of the accelerator issue, each row with its achieved TFLOP/s and its
peak memory:

- `text`: the Text Transformer pretraining step (`lra.py:text,transformer,spt-masked`, first
  stage: d 512, 6 layers, 8 heads, FFN 2048, L 4096, byte vocabulary, per-token head, AdamW) at
  batch 8 and 32, fp32 and bf16 (`model.dtype=bfloat16`), sptlib and PyTorch
  (`benchmarks/peers/torch_text_transformer.py`: TF32 matmuls for fp32, autocast +
  `scaled_dot_product_attention` for bf16);
- `attention`: softmax attention forward+backward at B 4, L 4096, 8 heads of 64, bf16 and fp32:
  sptlib's algorithms through `sptlib.kernels.platform.attention` (the platform's kernel, and
  the jnp reference) and `jax.nn.dot_product_attention` (`xla`; `cudnn` on GPU); and local
  attention (L 16384, window ±4096, B 2, 4 heads of 32) vs `jax.nn`'s `local_window_size`;
- `s4d`: the S4D mixer forward+backward (B 8, H 256, N 64) at 1k / 4k / 16k vs the PyTorch block
  (`benchmarks/peers/torch_s4d.py`);
- `steps`: the PathX S4 and local-attention Transformer steps (batch 8, L 16384), the ListOps
  Transformer step, and the GSS language model at paper size (`gss_lm.py:pg19`: 16 layers,
  E 1024, L 4096, batch 16, bf16 as configured; the pod mesh reduced to the local devices) with
  its equal-size Transformer.

Every row is guarded: an error (out of memory, PyTorch missing) becomes an error row and the report
goes on; rows that would start too late for `budget_s` (a train step reserves 60 s) are
skipped (listed as such). FLOPs: model FLOPs
(no recomputation); sptlib rows count them from the traced program (`train_step._model_flops`,
`sptlib.train.flops`), PyTorch rows use the closed form of their reference module (matmuls), the
attention rows `3 x 4 B H L^2 D`. Peak memory: XLA's plan of the compiled executable (arguments +
outputs + temporaries - donated) for JAX rows; `torch.cuda.max_memory_allocated` for PyTorch on a
GPU (not measured for PyTorch on a CPU). `tiny=True` runs the same code at toy sizes (seconds, on
a CPU: tests/test_bench.py). On a GPU host set nothing: the CLI sets
`XLA_PYTHON_CLIENT_PREALLOCATE=false` and `XLA_PYTHON_CLIENT_MEM_FRACTION=0.6` (unless set) so
that PyTorch, in the same process, has memory left.
"""

import gc
import time

import jax
import jax.numpy as jnp
import numpy as np

from sptlib.bench import common, mixers, peers, train_step
from sptlib.kernels import platform
from sptlib.train import flops as flop_count

TEXT = peers.TEXT_CONFIG
SECTIONS = ("text", "attention", "s4d", "steps")
# Attention rows: sptlib's algorithms through `sptlib.kernels.platform.attention`, with the
# platform's kernel (`auto`) and the jnp reference, and `jax.nn.dot_product_attention`.
ATTENTION_ROWS = (("sptlib plain", "plain", "auto"), ("sptlib plain, jnp", "plain", "reference"),
                  ("sptlib chunked", "chunked", "auto"),
                  ("sptlib chunked, jnp", "chunked", "reference"))
LOCAL_ROWS = (("sptlib local", "local", "auto"), ("sptlib local, jnp", "local", "reference"))
FULL = dict(text_batches=(8, 32), text_dtypes=("bfloat16", "float32"), text_length=0,
            text_overrides={},
            attn=dict(batch=4, length=4096, heads=8, head_dim=64), attn_chunk=512,
            attn_dtypes=("bfloat16", "float32"),
            local=dict(batch=2, length=16384, heads=4, head_dim=32), local_window=4096,
            s4d=mixers.MixerSettings(), s4d_lengths=(1024, 4096, 16384),
            steps=(("lra.py:pathx,s4,spt-masked", 8, "float32"),
                   ("lra.py:pathx,transformer,spt-masked", 8, "float32"),
                   ("lra.py:pathx,transformer,spt-masked", 8, "bfloat16"),
                   ("lra.py:listops,transformer,spt-masked", 8, "float32"),
                   ("lra.py:listops,transformer,spt-masked", 8, "bfloat16"),
                   ("gss_lm.py:pg19", 16, "bfloat16"),
                   ("gss_lm.py:pg19,model=transformer", 16, "bfloat16")),
            repeats=5, max_seconds=10.0,
            reserve_s=60.0)  # a train-step row (build, compile, FLOP count) needs about this
TINY = dict(text_batches=(2, 4), text_dtypes=("bfloat16", "float32"), text_length=128,
            text_overrides={"model.d_model": 32, "model.n_layers": 2,
                            "model.attention.n_heads": 2, "model.attention.chunk_size": 64},
            attn=dict(batch=1, length=256, heads=2, head_dim=16), attn_chunk=64,
            attn_dtypes=("bfloat16", "float32"),
            local=dict(batch=1, length=512, heads=2, head_dim=16), local_window=64,
            s4d=mixers.MixerSettings(ssm_batch=2, ssm_d_model=16, ssm_d_state=8),
            s4d_lengths=(256, 512),
            steps=(("lra.py:pathx,s4,spt-masked", 2, "float32"),
                   ("gss_lm.py:pg19", 2, "bfloat16")),
            repeats=2, max_seconds=1.0, reserve_s=0.0)


def _tiny_config(config):
    from sptlib.configs import testing  # the tests' shrinking, reused for --tiny
    testing.tiny(config)


def _torch_threads():
    """PyTorch on a CPU gets the cores XLA gets (its default may oversubscribe them)."""
    if jax.default_backend() == "cpu":
        try:
            import torch
            torch.set_num_threads(common.num_cores())
        except ImportError:
            pass


def free_memory():
    """Drops what the last row left: Python garbage, PyTorch's cached CUDA blocks."""
    gc.collect()
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def _time(fn, repeats, max_seconds):
    """(median seconds, calls) of `fn()` after one warm-up call; results blocked on."""
    common.block(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        common.block(fn())
        times.append(time.perf_counter() - t0)
        if len(times) >= 2 and sum(times) >= max_seconds:
            break
    return float(np.median(times)), len(times)


def _rate(rec):
    if rec.get("flops") and rec.get("seconds"):
        rec["tflops_per_s"] = round(rec["flops"] / rec["seconds"] / 1e12, 4)
    return rec


def _memory(compiled):
    try:
        m = compiled.memory_analysis()
        temp = int(m.temp_size_in_bytes)
    except Exception:  # noqa: BLE001 - a backend without memory analysis
        temp = None
    return {"peak_bytes": common.compiled_peak_bytes(compiled), "temp_bytes": temp,
            "peak_method": "xla plan"}


# ---------------------------------------------------------------------------------------------
# Rows (each returns one record; `Report.row` guards it)


def sptlib_step(spec, *, batch, dtype, length=0, overrides=None, transform=None, repeats=5,
                max_seconds=10.0):
    """One engine train step of `spec` (first stage), compiled once, then timed."""
    ov = {"model.dtype": dtype, **(overrides or {})}
    p = train_step.prepare(spec, batch_size=batch, max_length=length, overrides=ov,
                           transform=transform)
    built = p["built"]
    t0 = time.perf_counter()
    compiled = built.train_step.lower(built.state, p["gbatch"]).compile()
    compile_s = time.perf_counter() - t0
    rec = {"shape": f"B {p['batch_size']}, L {p['length']}", "dtype": dtype,
           "compile_s": round(compile_s, 2), **_memory(compiled)}
    holder = [built.state]  # donated by every call: only the closure holds the live state

    def step():
        holder[0], metrics = compiled(holder[0], p["gbatch"])
        return metrics
    rec["seconds"], rec["calls"] = _time(step, repeats, max_seconds)
    flops, method = train_step._model_flops(built.model_cfg, built.objective.head_cfg,
                                            built.objective, None, p["batch"])
    rec.update(flops=flops, flops_method=method, params=int(sum(
        np.prod(x.shape) for x in jax.tree.leaves(holder[0].params))))
    if p["mesh_note"]:
        rec["note"] = p["mesh_note"]
    del holder[:]
    return _rate(rec)


def torch_text_step(*, batch, dtype, sizes, length, repeats, max_seconds):
    """The PyTorch Text Transformer step on the accelerator JAX runs on."""
    import torch
    device = peers.torch_device()
    if device is None:
        raise RuntimeError(f"PyTorch has no device for JAX's backend {jax.default_backend()}")
    ref = peers._reference("torch_text_transformer")
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    step = peers.synced(ref.make_step(length, batch, device=device, dtype=dtype, **sizes), device)
    rec = {"shape": f"B {batch}, L {length}", "dtype": dtype, "device": device}
    rec["seconds"], rec["calls"] = _time(step, repeats, max_seconds)
    rec["flops"], rec["flops_method"] = ref.flops_per_step(length, batch, **sizes), "closed form"
    if device == "cuda":
        rec.update(peak_bytes=int(torch.cuda.max_memory_allocated()),
                   peak_method="torch max allocated")
    del step
    return _rate(rec)


def attention_row(fn, *, batch, length, heads, head_dim, dtype, repeats, max_seconds,
                  window=0):
    """Forward+backward (gradients of q, k, v) of `fn(q, k, v)`; `window`: its band (FLOPs)."""
    dt = jnp.dtype(dtype)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(key, (batch, length, heads, head_dim), dt) for key in keys)

    def loss(q, k, v):
        return jnp.sum(fn(q, k, v).astype(jnp.float32) ** 2)
    t0 = time.perf_counter()
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
    rec = {"shape": f"B {batch}, L {length}, {heads}x{head_dim}", "dtype": dtype,
           "compile_s": round(time.perf_counter() - t0, 2), **_memory(compiled)}
    rec["seconds"], rec["calls"] = _time(lambda: compiled(q, k, v), repeats, max_seconds)
    span = min(length, 2 * window + 1) if window else length  # keys per query (interior)
    rec["flops"] = 3 * 4.0 * batch * heads * length * span * head_dim
    rec["flops_method"] = "3 x 4 B H L span D"
    if window:
        rec["shape"] += f", window ±{window}"
    return _rate(rec)


def sptlib_attention(algorithm, kernel, chunk_size, window=0):
    def fn(q, k, v):
        return platform.attention(q, k, v, window=window, algorithm=algorithm,
                                  chunk_size=chunk_size, kernel=kernel)
    return fn


def jax_nn_attention(implementation, window=0):
    def fn(q, k, v):  # q arrives pre-scaled, as sptlib's kernels take it
        return jax.nn.dot_product_attention(
            q, k, v, scale=1.0, implementation=implementation,
            local_window_size=(window, window) if window else None)
    return fn


def _s4d_shape(s, length):
    return f"B {s.ssm_batch}, H {s.ssm_d_model}, N {s.ssm_d_state}, L {length}"


def s4d_sptlib(length, s, repeats, max_seconds):
    """sptlib's S4D mixer forward+backward (gradients of parameters and input) at `length`."""
    module, batch, d_model, _ = mixers.mixer_module("s4d", s)
    _, fwdbwd, variables, x = mixers._functions(module, batch, d_model, length)
    traced = fwdbwd.trace(variables, x)
    flops = flop_count.jaxpr_flops(traced.jaxpr.jaxpr) or None
    t0 = time.perf_counter()
    compiled = traced.lower().compile()
    rec = {"shape": _s4d_shape(s, length), "dtype": "float32", "flops": flops,
           "compile_s": round(time.perf_counter() - t0, 2),
           "flops_method": "jaxpr (matmuls, FFTs)", **_memory(compiled)}
    rec["seconds"], rec["calls"] = _time(lambda: compiled(variables, x), repeats, max_seconds)
    return _rate(rec)


def s4d_torch(length, s, repeats, max_seconds, flops=None):
    """The PyTorch S4D block forward+backward on the accelerator JAX runs on."""
    import torch
    device = peers.torch_device()
    if device is None:
        raise RuntimeError(f"PyTorch has no device for JAX's backend {jax.default_backend()}")
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    ref = peers._reference("torch_s4d").S4D(s.ssm_d_model, s.ssm_d_state).to(device)
    u = torch.randn(s.ssm_batch, s.ssm_d_model, length, device=device, requires_grad=True)

    def step():
        ref.zero_grad(set_to_none=True)
        u.grad = None
        loss = ref(u).square().mean()
        loss.backward()
        return loss.detach()
    rec = {"shape": _s4d_shape(s, length), "dtype": "float32", "device": device,
           "flops": flops, "flops_method": "sptlib's count"}
    rec["seconds"], rec["calls"] = _time(peers.synced(step, device), repeats, max_seconds)
    if device == "cuda":
        rec.update(peak_bytes=int(torch.cuda.max_memory_allocated()),
                   peak_method="torch max allocated")
    return _rate(rec)


def text_peer_sizes(length=0, overrides=None):
    """(PyTorch sizes, length) of the Text Transformer config, from the config alone."""
    config = train_step.apply_overrides(train_step.load_config(TEXT), overrides)
    info = train_step.task_info(config.data)
    full = int(info["max_length"])
    return peers.text_sizes(config, info), min(full, length) if length else full


# ---------------------------------------------------------------------------------------------
# The report


class Report:
    """Collects guarded rows under a time budget; `emit` prints each one as a JSON line."""

    def __init__(self, budget_s=450.0, emit=common.emit):
        self.deadline = time.monotonic() + budget_s
        self.records, self.emit = [], emit

    def row(self, section, name, fn, reserve_s=0.0, **context):
        """Runs `fn()` (a record's fields) unless fewer than `reserve_s` seconds are left."""
        base = {"name": f"accel/{section}/{name}", "section": section, "row": name,
                "kind": "accel", **context}
        if time.monotonic() + reserve_s > self.deadline:
            rec = {**base, "kind": "skipped", "reason": "time budget spent"}
        else:
            try:
                rec = {**base, **fn()}
            except Exception as e:  # noqa: BLE001 - one failing row must not end the report
                rec = {**base, "kind": "error", "error": f"{type(e).__name__}: {str(e)[:240]}"}
        free_memory()
        self.records.append(self.emit(rec))
        return rec


def run(*, tiny=False, budget_s=390.0, sections=SECTIONS, emit=common.emit):
    """Runs the report's sections; returns the records (render them with `render`)."""
    z = TINY if tiny else FULL
    rep = Report(budget_s, emit)
    _torch_threads()
    timing = dict(repeats=z["repeats"], max_seconds=z["max_seconds"])
    transform = _tiny_config if tiny else None

    def text(batches):
        for batch in batches:
            for dtype in z["text_dtypes"]:
                ctx = dict(batch=batch, dtype=dtype)
                rep.row("text", "sptlib", lambda: sptlib_step(
                    TEXT, batch=batch, dtype=dtype, length=z["text_length"],
                    overrides=z["text_overrides"], **timing), reserve_s=z["reserve_s"], **ctx)

                def torch_text():
                    sizes, length = text_peer_sizes(z["text_length"], z["text_overrides"])
                    return torch_text_step(batch=batch, dtype=dtype, sizes=sizes,
                                           length=length, **timing)
                rep.row("text", "pytorch", torch_text, **ctx)
    # The smallest text batch first, the larger ones (slow to compile, may not fit) last.
    if "text" in sections:
        text(z["text_batches"][:1])
    if "attention" in sections:
        gpu = jax.default_backend() == "gpu"
        for shape, window, rows in ((z["attn"], 0, ATTENTION_ROWS),
                                    (z["local"], z["local_window"], LOCAL_ROWS)):
            kernels = {name: sptlib_attention(alg, kernel, z["attn_chunk"], window)
                       for name, alg, kernel in rows}
            kernels["jax.nn xla"] = jax_nn_attention("xla", window)
            if gpu and not window:  # cuDNN refuses a right-hand window without a causal mask
                kernels["jax.nn cudnn"] = jax_nn_attention("cudnn")
            for dtype in z["attn_dtypes"]:
                for name, fn in kernels.items():
                    if name.endswith("cudnn") and dtype == "float32":
                        continue  # cuDNN's fused attention takes fp16 / bf16 only
                    rep.row("attention", name, lambda: attention_row(
                        fn, dtype=dtype, window=window, **shape, **timing), dtype=dtype)
    if "s4d" in sections:
        for length in z["s4d_lengths"]:
            ours = rep.row("s4d", "sptlib", lambda: s4d_sptlib(length, z["s4d"], **timing),
                           length=length)
            rep.row("s4d", "pytorch", lambda: s4d_torch(length, z["s4d"], flops=ours.get(
                "flops"), **timing), length=length)
    if "steps" in sections:
        for spec, batch, dtype in z["steps"]:
            rep.row("steps", spec, lambda: sptlib_step(spec, batch=batch, dtype=dtype,
                                                       transform=transform, **timing),
                    reserve_s=z["reserve_s"], batch=batch, dtype=dtype)
    if "text" in sections:
        text(z["text_batches"][1:])
    return rep.records
