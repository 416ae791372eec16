"""Times sptlib's 2 x 64 Transformer train step at L = 256 (`sptlib.bench.peers.TRANSFORMER_CONFIG`) under several XLA:CPU flag settings.

    python benchmarks/xla_cpu_flags.py [--rounds 20] [--core 1]

Each setting runs in a fresh process (XLA reads `XLA_FLAGS` once, at start-up), pinned to one
core with `taskset` when `--core` is given; the default setting is measured first and last so
that drift shows. Prints one JSON line per setting: median and minimum step time over `rounds`
steps after 3 warm-up steps, and the first (compiling) step. Results: the history of docs/performance_notes.md (git show ded39a6:docs/performance_notes.md).
"""

import argparse
import json
import os
import subprocess
import sys
import time

FLAGS = ("", "--xla_cpu_use_thunk_runtime=false", "--xla_cpu_use_onednn=true",
         "--xla_cpu_experimental_onednn_custom_call=true", "--xla_cpu_use_xnnpack=true",
         "--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY",
         "--xla_cpu_enable_fast_math=true", "--xla_cpu_multi_thread_eigen=false",
         "--xla_cpu_use_fusion_emitters=false", "")


def one(rounds):
    import jax
    from sptlib.bench import peers
    from sptlib.bench import train_step as bt
    p = bt.prepare(peers.TRANSFORMER_CONFIG, max_tokens=32 * 256)
    step = bt.step_closure(p)
    t0 = time.perf_counter()
    jax.block_until_ready(step())
    first = time.perf_counter() - t0
    for _ in range(3):
        jax.block_until_ready(step())
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        jax.block_until_ready(step())
        ts.append(time.perf_counter() - t)
    ts.sort()
    print(json.dumps({"flags": os.environ.get("XLA_FLAGS", ""), "batch": p["batch_size"],
                      "median_ms": round(1000 * ts[len(ts) // 2], 1),
                      "min_ms": round(1000 * ts[0], 1), "first_s": round(first, 1)}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--core", type=int, default=None)
    ap.add_argument("--flags", action="append", default=None,
                    help="XLA_FLAGS value to time (repeatable; default: the built-in list)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        return one(a.rounds)
    for f in a.flags if a.flags is not None else FLAGS:
        cmd = [sys.executable, __file__, "--one", "--rounds", str(a.rounds)]
        if a.core is not None:
            cmd = ["taskset", "-c", str(a.core)] + cmd
        p = subprocess.run(cmd, env=dict(os.environ, XLA_FLAGS=f), capture_output=True,
                           text=True, timeout=600)
        lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
        print(lines[-1] if lines else json.dumps({"flags": f, "error": p.stderr[-300:]}),
              flush=True)


if __name__ == "__main__":
    main()
