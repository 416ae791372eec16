"""Side by side with other libraries' reference blocks, in the same run (`--peer torch`).

Rows (each measured interleaved, A B A B ..., medians, so load drifts hit both sides alike):

- S4D block, forward+backward (gradients for parameters and input), batch 8, H 256, N 64:
  sptlib's `s4d` mixer vs the PyTorch block of state-spaces/s4 `models/s4/s4d.py`;
- S4 block (DPLR, the reference's CPU fallback Cauchy kernel), same sizes, up to `s4_max_length`
  (the fallback materialises a `[4, H, N, L/2+1]` complex matrix);
- the quickstart Transformer classifier's whole train step (AdamW): sptlib's engine step vs a
  `torch.nn.TransformerEncoder` classifier and a plain Flax Linen one (the floor).

The reference blocks live in the repository's top-level `benchmarks/peers/` (not in the sptlib
package). PyTorch is optional and never used by tests or CI; a CPU build is enough:
`pip install torch==2.13.0`.
"""

import importlib
import os
import statistics
import sys
import time

from sptlib.bench import common, mixers, train_step

PEERS = ("torch",)
# sptlib tokens/s over the peer's, per row (the performance issue's acceptance ratios).
TARGETS = {"s4d": 4.0, "s4": 5.0, "transformer_train_step": 1.0}
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


def _reference(name):
    """`benchmarks.peers.<name>` from the repository root (outside the sptlib package)."""
    if train_step.REPO_ROOT not in sys.path:
        sys.path.insert(0, train_step.REPO_ROOT)
    if not os.path.isdir(os.path.join(train_step.REPO_ROOT, "benchmarks", "peers")):
        raise SystemExit(f"--peer: {train_step.REPO_ROOT}/benchmarks/peers not found (the reference "
                         "blocks ship with the repository, not the installed package)")
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
           "target_of": "ratio", **extra}
    return common.with_target(rec, rec["ratio"], TARGETS[name], ">=")


def ssm_rows(lengths, s, *, s4_max_length=4096, rounds=7, max_seconds=20.0, emit=common.emit):
    """S4D and S4 (DPLR) forward+backward, sptlib vs the PyTorch reference, per length."""
    blocks = {"s4d": _reference("torch_s4d").S4D, "s4": _reference("torch_s4").S4Block}
    out = []
    for name, cls in blocks.items():
        for length in lengths:
            if name == "s4" and length > s4_max_length:
                out.append(emit({"name": f"peer/{name}", "kind": "skipped", "length": length,
                                 "reason": f"reference Cauchy fallback above {s4_max_length}"}))
                continue
            try:
                out.append(emit(_ssm_row(name, cls, length, s, rounds, max_seconds)))
            except Exception as e:  # noqa: BLE001 - one broken row must not end the run
                out.append(emit({"name": f"peer/{name}", "kind": "error", "length": length,
                                 "error": f"{type(e).__name__}: {str(e)[:300]}"}))
    return out


def _ssm_row(name, cls, length, s, rounds, max_seconds):
    import torch
    module, batch, d_model, _ = mixers.mixer_module(name, s)
    _, fwdbwd, variables, x = mixers._functions(module, batch, d_model, length)
    compiled = fwdbwd.lower(variables, x).compile()
    torch.manual_seed(0)
    ref = cls(d_model, s.ssm_d_state)
    u = torch.randn(batch, d_model, length, requires_grad=True)   # the reference's [B, H, L]

    def torch_step():
        ref.zero_grad(set_to_none=True)
        u.grad = None
        loss = ref(u).square().mean()
        loss.backward()
        return loss.detach()
    secs, n = time_interleaved({"sptlib": lambda: compiled(variables, x), "torch": torch_step},
                               rounds=rounds, max_seconds=max_seconds)
    return _row(name, length, batch * length, secs, batch=batch, d_model=d_model,
                d_state=s.ssm_d_state, rounds=n)


def transformer_row(*, spec=TRANSFORMER_CONFIG, max_tokens=8192, rounds=7, max_seconds=20.0,
                    emit=common.emit):
    """The quickstart Transformer's train step: sptlib vs torch, with plain Flax as the floor."""
    p = train_step.prepare(spec, max_tokens=max_tokens)
    m = p["config"].model
    sizes = {"d_model": int(m.d_model), "n_layers": int(m.n_layers),
             "n_heads": int(m.attention.n_heads), "d_ffn": int(m.ffn_mult * m.d_model),
             "num_classes": int(p["info"]["num_classes"])}
    length, batch = p["length"], p["batch_size"]
    fns = {"sptlib": train_step.step_closure(p),
           "flax": _reference("flax_transformer").make_step(length, batch, **sizes),
           "torch": _reference("torch_transformer").make_step(length, batch, **sizes)}
    secs, n = time_interleaved(fns, rounds=rounds, max_seconds=max_seconds)
    rec = _row("transformer_train_step", length, batch * length, secs, batch=batch,
               config=spec, rounds=n, **sizes)
    rec.update(flax_seconds=secs["flax"], flax_tokens_per_s=batch * length / secs["flax"],
               vs_flax=round(secs["flax"] / secs["sptlib"], 3),
               floor_met=bool(secs["sptlib"] <= secs["flax"]))
    return [emit(rec)]


def run(peer, lengths, s, *, max_tokens=8192, rounds=7, max_seconds=20.0, emit=common.emit):
    """The whole peer section (after `require(peer)`)."""
    import torch
    torch.set_num_threads(common.num_cores())
    return (ssm_rows(lengths, s, rounds=rounds, max_seconds=max_seconds, emit=emit)
            + transformer_row(max_tokens=max_tokens, rounds=rounds, max_seconds=max_seconds,
                              emit=emit))
