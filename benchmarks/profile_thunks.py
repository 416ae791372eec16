"""Where an XLA:CPU step spends its time: a `jax.profiler` trace summed per XLA thunk and per part.

    python benchmarks/profile_thunks.py transformer [model.scan_unroll=1 ...]   # the peer step
    python benchmarks/profile_thunks.py s4d [1024]                                # the S4D mixer
    python benchmarks/profile_thunks.py s4 4096                                   # any SSM mixer

`transformer`: sptlib's engine train step of `sptlib.bench.peers.TRANSFORMER_CONFIG` (batch 32 x
256 tokens), with optional `dotted.key=python-literal` config overrides. `s4d` (or another SSM
mixer: s4, dss, dlr, s5, gss): its forward+backward at the peer size (batch 8, H 256, N 64) and the given length.

Runs 3 warm-up steps, traces `STEPS` steps, and sums the trace's complete events per thunk (an
XLA:CPU thunk is one fusion, dot, FFT or copy of the compiled program). Each thunk is mapped to
its HLO `op_name` (the JAX source path: module, layer, primitive) and grouped into parts:
attention dots, the rest of attention (softmax, masks, transposes), FFN, norms, SSM kernel /
convolution / output projection, optimiser, other. Thunks can overlap on the two cores, so the
sum may exceed the wall time; it shows where the work is, not the critical path. Results:
docs/performance_notes.md (its history: git show ded39a6:docs/performance_notes.md).
"""

import ast
import collections
import glob
import gzip
import json
import os
import re
import shutil
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

STEPS = 8
SKIP = ("$", "ThunkExecutor", "PjitFunction", "SlinkyThreadPool")


def transformer_step(overrides):
    from benchmarks.transformer_step_ab import prepare
    from sptlib.bench import train_step as bt
    p = prepare(overrides)
    b = p["built"]
    hlo = b.train_step.lower(b.state, p["gbatch"]).compile().as_text()
    return bt.step_closure(p), hlo


def ssm_step(name, length):
    from sptlib.bench import mixers
    module, batch, d_model, _ = mixers.mixer_module(name, mixers.MixerSettings())
    _, fwdbwd, variables, x = mixers._functions(module, batch, d_model, length)
    compiled = fwdbwd.lower(variables, x).compile()
    return (lambda: compiled(variables, x)), compiled.as_text()


def part(op_name):
    """The part of the model an HLO op_name belongs to."""
    o = re.sub(r"layer_\d+/", "", op_name)
    if not o:
        return "unnamed (parameter plumbing, copies)"
    if "mixer" in o and "_ssm" not in o and "_post" not in o:
        return "attention dots" if "dot_general" in o else "attention: softmax, masks, transposes"
    if "ssm.kernel" in o:
        return "SSM kernel generation"
    if "_ssm" in o:
        return "SSM FFT convolution (+ D skip)"
    if "_post" in o:
        return "SSM output projection (Dense + GLU)" if "out_proj" in o else "SSM GELU / GLU"
    if "/ffn" in o:
        return "FFN dots" if "dot_general" in o else "FFN: GELU, bias"
    if "norm" in o:
        return "norms"
    if "encoder" in o:
        return "encoder"
    if "head" in o or "loss" in o:
        return "head, loss"
    if "SequenceModel" not in o and "Mixer" not in o:
        return "optimiser, metrics, step plumbing"
    return "other model ops"


def main():
    args = sys.argv[1:]
    if not args or args[0] not in ("transformer", "s4d", "s4", "dss", "dlr", "s5", "gss"):
        raise SystemExit(__doc__)
    if args[0] == "transformer":
        overrides = dict(a.split("=", 1) for a in args[1:])
        step, hlo = transformer_step({k: ast.literal_eval(v) for k, v in overrides.items()})
    else:
        step, hlo = ssm_step(args[0], int(args[1]) if len(args) > 1 else 1024)
    op_names = {}
    for m in re.finditer(r"%([\w.\-]+) = [^\n]*?op_name=\"([^\"]*)\"", hlo):
        op_names.setdefault(m.group(1), m.group(2))
    for _ in range(3):
        jax.block_until_ready(step())
    trace_dir = tempfile.mkdtemp(prefix="sptlib_profile_")
    try:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(STEPS):
                jax.block_until_ready(step())
        path = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)[0]
        with gzip.open(path) as f:
            trace = json.load(f)
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    by_part, by_thunk = collections.Counter(), collections.Counter()
    wall = 0.0
    for e in events:
        if e.get("ph") != "X":
            continue
        if e["name"] == "ThunkExecutor::Execute (wait for completion)":
            wall += e.get("dur", 0)
        if e["name"].startswith(SKIP):
            continue
        name = op_names.get(e["name"], "")
        by_part[part(name)] += e.get("dur", 0)
        by_thunk[(e["name"], name if os.environ.get("FULL_NAMES") else name.split("/")[-1])] += (
            e.get("dur", 0))
    total = sum(by_part.values())
    print(f"# {args}: {total / STEPS / 1e3:.1f} ms of thunks per step "
          f"(executor wall {wall / STEPS / 1e3:.1f} ms), {STEPS} steps traced")
    for name, t in by_part.most_common():
        print(f"{t / STEPS / 1e3:9.2f} ms  {100 * t / total:5.1f}%  {name}")
    print("# largest thunks")
    for (thunk, prim), t in by_thunk.most_common(int(os.environ.get("TOP", "12"))):
        print(f"{t / STEPS / 1e3:9.2f} ms  {thunk}  ({prim})")


if __name__ == "__main__":
    main()
