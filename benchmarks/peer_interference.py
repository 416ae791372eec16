"""How much one framework's call slows the next: sptlib's and PyTorch's Transformer train steps,
each timed straight after the other's and after a pause.

    python benchmarks/peer_interference.py [ROUNDS]   # needs torch

Right after a call a framework's thread pool keeps spinning for a while (PyTorch's OpenMP team,
XLA's intra-op pool); on 2 cores that slows whichever call comes next. This is why
`sptlib.bench.peers.time_interleaved` pauses before each timed call. The steps are those of
`benchmarks/transformer_step_ab.py` (`default`, `torch`). Prints medians per (step, pause).
Results: the history of docs/performance_notes.md (git show ded39a6:docs/performance_notes.md).
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import transformer_step_ab as ab  # noqa: E402

PAUSES = (0.0, 0.002, 0.01, 0.05, 0.2)


def main(rounds):
    import torch
    torch.set_num_threads(2)
    steps = {"sptlib": ab.make("default"), "torch": ab.make("torch")}
    for _ in range(3):
        for f in steps.values():
            f()
    times = {(name, p): [] for name in steps for p in PAUSES}
    for _ in range(rounds):
        for p in PAUSES:
            for name, other in (("sptlib", "torch"), ("torch", "sptlib")):
                steps[other]()
                time.sleep(p)
                t0 = time.perf_counter()
                steps[name]()
                times[(name, p)].append(time.perf_counter() - t0)
    for (name, p), t in times.items():
        print(f"{name:7s} after the other step, then a {1e3 * p:5.0f} ms pause: "
              f"{1e3 * statistics.median(t):6.1f} ms", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 9)
