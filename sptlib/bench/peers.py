"""Side by side with other libraries' reference blocks, in the same run (`--peer torch`).

Rows (each measured interleaved, A B A B ..., medians, so load drifts hit both sides alike):

- S4D block, forward+backward (gradients for parameters and input), batch 8, H 256, N 64:
  sptlib's `s4d` mixer vs the PyTorch block of state-spaces/s4 `models/s4/s4d.py`;
- S4 block (DPLR, the reference's CPU fallback Cauchy kernel), same sizes, up to `s4_max_length`
  (the fallback materialises a `[4, H, N, L/2+1]` complex matrix);
- the quickstart Transformer classifier's whole train step (AdamW): sptlib's engine step vs a
  `torch.nn.TransformerEncoder` classifier and a plain Flax Linen one (the floor).

- on a GPU, the Text Transformer pretraining step at the paper's size (`TEXT_CONFIG`: d 512,
  6 layers, 8 heads, FFN 2048, L 4096, byte vocabulary, per-token head, AdamW; batch 8) with
  `model.dtype=bfloat16`, vs PyTorch bf16 autocast + `scaled_dot_product_attention`
  (`benchmarks/peers/torch_text_transformer.py`).

The peers run on the accelerator JAX runs on (`torch_device`: CUDA when JAX's backend is a GPU,
the CPU on a CPU; none on a TPU, where the rows say so), and every PyTorch call on a GPU is
timed up to `torch.cuda.synchronize()`. The reference blocks live in the repository's top-level
`benchmarks/peers/` (not in the sptlib package). PyTorch is optional and never needed by the
default tests or CI; a CPU build is enough on CPU: `pip install torch==2.13.0`.
"""

import importlib
import os
import statistics
import sys
import time

import jax

from sptlib.bench import common, mixers, train_step

PEERS = ("torch",)
# sptlib tokens/s over the peer's, per row (the performance issue's acceptance ratios).
TARGETS = {"s4d": 4.0, "s4": 5.0, "transformer_train_step": 1.0,
           "text_transformer_train_step": 1.0}
# On a GPU the S4D target is the accelerator issue's: >= 2x the PyTorch block at every length.
GPU_TARGETS = {"s4d": 2.0}
TEXT_CONFIG = "lra.py:text,transformer,spt-masked"
# The 2 x 64 Transformer classifier at L = 256, batch 32 (the first quickstart's size; the
# quickstart now runs at L = 64): a 16 x 16 continuous-pixel task, Linen init.
TRANSFORMER_CONFIG = "reproduce_local.py:transformer,scratch,setting=l64,resolution=16"


def require(peer):
    """Imports the peer library or exits with one line saying how to install it."""
    if peer not in PEERS:
        raise SystemExit(f"--peer: unknown peer {peer!r}; known: {PEERS}")
    try:
        importlib.import_module("torch")
    except ImportError as e:
        raise SystemExit(f"--peer torch: PyTorch is not importable ({e}); it is optional, "
                         "install a CPU build with `pip install torch==2.13.0`") from None


def torch_device():
    """The PyTorch device of JAX's backend: "cuda" (GPU), "cpu" (CPU), or None (TPU: none)."""
    import torch
    backend = jax.default_backend()
    if backend == "gpu":
        if not torch.cuda.is_available():
            raise RuntimeError("JAX runs on a GPU but this PyTorch build sees no CUDA device "
                               "(install a CUDA build of torch)")
        return "cuda"
    return "cpu" if backend == "cpu" else None


def synced(fn, device):
    """`fn` followed by `torch.cuda.synchronize()` on a GPU (PyTorch calls return early)."""
    if device != "cuda":
        return fn
    import torch

    def call():
        out = fn()
        torch.cuda.synchronize()
        return out
    return call


def _reference(name):
    """`benchmarks.peers.<name>` from a clone of the repository (PyTorch reference blocks that
    ship with the repository, not the package): the current directory's, else the clone this
    sptlib was imported from."""
    clone = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    roots = [r for r in (os.getcwd(), clone) if os.path.isdir(os.path.join(r, "benchmarks", "peers"))]
    if not roots:
        raise SystemExit("--peer: no benchmarks/peers/ here or beside sptlib (the reference blocks "
                         "ship with the repository, not the installed package: run from a clone)")
    if roots[0] not in sys.path:
        sys.path.insert(0, roots[0])
    return importlib.import_module(f"benchmarks.peers.{name}")


def time_interleaved(fns, *, rounds=7, max_seconds=20.0, warmup=2, min_rounds=3, settle=0.02):
    """({name: median seconds per call}, rounds) of no-argument callables, interleaved by
    round (after `warmup` calls each).

    Each timed call starts after `settle` idle seconds: right after one framework's call its
    thread pool still spins (PyTorch's OpenMP team, XLA's intra-op pool) and slows whichever call
    comes next, by up to ~20% for the Transformer step on 2 cores (measured: PyTorch's step 124 ms
    straight after sptlib's, 104 ms after a pause)."""
    for fn in fns.values():
        for _ in range(warmup):
            common.block(fn())
    times = {name: [] for name in fns}
    total = 0.0
    for r in range(rounds):
        for name, fn in fns.items():
            time.sleep(settle)
            t0 = time.perf_counter()
            common.block(fn())
            dt = time.perf_counter() - t0
            times[name].append(dt)
            total += dt
        if r + 1 >= min_rounds and total >= max_seconds:
            break
    return {name: statistics.median(t) for name, t in times.items()}, r + 1


def _row(name, length, tokens, secs, peer="torch", **extra):
    ours, theirs = secs["sptlib"], secs[peer]
    rec = {"name": f"peer/{name}", "kind": "peer", "peer": peer, "length": length,
           "seconds": ours, "tokens_per_s": tokens / ours, "peer_seconds": theirs,
           "peer_tokens_per_s": tokens / theirs, "ratio": round(theirs / ours, 3),
           "target_of": "ratio", "backend": jax.default_backend(), **extra}
    target = (GPU_TARGETS if rec["backend"] == "gpu" else {}).get(name, TARGETS[name])
    return common.with_target(rec, rec["ratio"], target, ">=")


def ssm_rows(lengths, s, *, s4_max_length=4096, rounds=7, max_seconds=20.0, emit=common.emit,
             device="cpu"):
    """S4D and S4 (DPLR) forward+backward, sptlib vs the PyTorch reference on `device`."""
    blocks = {"s4d": _reference("torch_s4d").S4D, "s4": _reference("torch_s4").S4Block}
    out = []
    for name, cls in blocks.items():
        for length in lengths:
            if name == "s4" and length > s4_max_length:
                out.append(emit({"name": f"peer/{name}", "kind": "skipped", "length": length,
                                 "reason": f"reference Cauchy fallback above {s4_max_length}"}))
                continue
            try:
                out.append(emit(_ssm_row(name, cls, length, s, rounds, max_seconds,
                                         device=device)))
            except Exception as e:  # noqa: BLE001 - one broken row must not end the run
                out.append(emit({"name": f"peer/{name}", "kind": "error", "length": length,
                                 "error": f"{type(e).__name__}: {str(e)[:300]}"}))
    return out


def _ssm_row(name, cls, length, s, rounds, max_seconds, device="cpu"):
    import torch
    module, batch, d_model, _ = mixers.mixer_module(name, s)
    _, fwdbwd, variables, x = mixers._functions(module, batch, d_model, length)
    compiled = fwdbwd.lower(variables, x).compile()
    torch.manual_seed(0)
    ref = cls(d_model, s.ssm_d_state).to(device)
    u = torch.randn(batch, d_model, length, device=device,
                    requires_grad=True)                            # the reference's [B, H, L]

    def torch_step():
        ref.zero_grad(set_to_none=True)
        u.grad = None
        loss = ref(u).square().mean()
        loss.backward()
        return loss.detach()
    secs, n = time_interleaved({"sptlib": lambda: compiled(variables, x),
                                "torch": synced(torch_step, device)},
                               rounds=rounds, max_seconds=max_seconds)
    return _row(name, length, batch * length, secs, batch=batch, d_model=d_model,
                d_state=s.ssm_d_state, rounds=n, device=device)


def transformer_row(*, spec=TRANSFORMER_CONFIG, max_tokens=8192, rounds=7, max_seconds=20.0,
                    emit=common.emit, device="cpu"):
    """The quickstart Transformer's train step: sptlib vs torch, with plain Flax as the floor."""
    p = train_step.prepare(spec, max_tokens=max_tokens)
    m = p["config"].model
    sizes = {"d_model": int(m.d_model), "n_layers": int(m.n_layers),
             "n_heads": int(m.attention.n_heads), "d_ffn": int(m.ffn_mult * m.d_model),
             "num_classes": int(p["info"]["num_classes"])}
    length, batch = p["length"], p["batch_size"]
    fns = {"sptlib": train_step.step_closure(p),
           "flax": _reference("flax_transformer").make_step(length, batch, **sizes),
           "torch": synced(_reference("torch_transformer").make_step(length, batch,
                                                                      device=device, **sizes),
                           device)}
    secs, n = time_interleaved(fns, rounds=rounds, max_seconds=max_seconds)
    rec = _row("transformer_train_step", length, batch * length, secs, batch=batch,
               config=spec, rounds=n, **sizes)
    rec.update(flax_seconds=secs["flax"], flax_tokens_per_s=batch * length / secs["flax"],
               vs_flax=round(secs["flax"] / secs["sptlib"], 3),
               floor_met=bool(secs["sptlib"] <= secs["flax"]))
    return [emit(rec)]


def text_sizes(config, info):
    """The PyTorch peer's sizes of a Text Transformer config (and its task's info)."""
    m = config.model
    return {"d_model": int(m.d_model), "n_layers": int(m.n_layers),
            "n_heads": int(m.attention.n_heads), "d_ffn": int(m.ffn_mult * m.d_model),
            "vocab": int(info["vocab_size"])}


def text_transformer_row(*, batch=8, dtype="bfloat16", length=0, overrides=None, rounds=7,
                         max_seconds=20.0, emit=common.emit, device="cpu"):
    """The Text Transformer pretraining step (`TEXT_CONFIG`, `model.dtype` = `dtype`), sptlib vs
    PyTorch (autocast for bfloat16, `scaled_dot_product_attention`), interleaved.
    `overrides` / `length` shrink it (tests on CPU); the default is the paper's size."""
    p = train_step.prepare(TEXT_CONFIG, batch_size=batch, max_length=length,
                           overrides={"model.dtype": dtype, **(overrides or {})})
    sizes = text_sizes(p["config"], p["info"])
    ref = _reference("torch_text_transformer")
    fns = {"sptlib": train_step.step_closure(p),
           "torch": synced(ref.make_step(p["length"], batch, device=device, dtype=dtype,
                                         **sizes), device)}
    secs, n = time_interleaved(fns, rounds=rounds, max_seconds=max_seconds)
    tokens = batch * p["length"]
    flops = ref.flops_per_step(p["length"], batch, **sizes)
    rec = _row("text_transformer_train_step", p["length"], tokens, secs, batch=batch,
               dtype=dtype, config=TEXT_CONFIG, rounds=n, device=device,
               flops_per_step=flops, tflops_per_s=round(flops / secs["sptlib"] / 1e12, 4),
               peer_tflops_per_s=round(flops / secs["torch"] / 1e12, 4), **sizes)
    return [emit(rec)]


def run(peer, lengths, s, *, max_tokens=8192, rounds=7, max_seconds=20.0, emit=common.emit):
    """The whole peer section (after `require(peer)`), on the accelerator JAX runs on."""
    import torch
    try:
        device = torch_device()
    except RuntimeError as e:
        return [emit({"name": "peer/all", "kind": "error", "error": str(e)})]
    if device is None:
        return [emit({"name": "peer/all", "kind": "skipped", "reason":
                      f"PyTorch has no device for JAX's backend {jax.default_backend()}"})]
    if device == "cpu":
        torch.set_num_threads(common.num_cores())
    kw = dict(rounds=rounds, max_seconds=max_seconds, emit=emit, device=device)
    out = ssm_rows(lengths, s, **kw) + transformer_row(max_tokens=max_tokens, **kw)
    if device == "cuda":  # the paper-size Text Transformer step: accelerators only
        try:
            out += text_transformer_row(**kw)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory; the section goes on
            out.append(emit({"name": "peer/text_transformer_train_step", "kind": "error",
                             "length": 4096, "error": f"{type(e).__name__}: {str(e)[:300]}"}))
    return out
