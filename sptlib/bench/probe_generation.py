"""Generation throughput of the synthetic probes against what a training step consumes.

    python -m sptlib.bench.probe_generation [--num=2048] [--repeats=5] [--records=DIR/comparison.json]
        [--batch=16] [--only=mqar --options='{"length": 32, "num_pairs": 4, "vocab_size": 24}']

Per probe (`sptlib.data.probes.PROBES`, at its default settings, or MAD's baselines for the MAD
tasks): the median over `repeats` of sequences generated per second for a set of `num`
(one process, one thread of NumPy). With `--records`, the training consumption of a finished
`sptlib.compare` grid on that probe (batch x training steps per second of each run's last stage,
the fastest run: the strictest comparison) and the ratio. Markdown on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from sptlib.data import mad, probes


def settings(name):
    """The probe's options (MAD tasks: MAD's baseline; others: the generator's defaults)."""
    if name in mad.MAD_SETTINGS:
        base = dict(mad.MAD_SETTINGS[name][0])
        base.pop("num_train", None)
        return base
    return {}


def throughput(name, num=2048, repeats=5, **options):
    """(wall, CPU) median sequences per second generating `num` sequences of probe `name`
    (CPU: per second of this process's CPU time, what a shared machine's load does not change)."""
    wall, cpu = [], []
    for r in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        probes.generate(name, num, seed=r, **options)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return num / statistics.median(wall), num / max(statistics.median(cpu), 1e-9)


def consumption(path, batch=16):
    """{task: (sequences per second of the fastest run, its model / regime)} from records
    (`batch`: the grid's training batch)."""
    with open(path) as f:
        records = json.load(f)
    out = {}
    for r in records:
        st = list((r.get("stages") or {}).values())
        if r.get("status") != "finished" or not st or not st[-1].get("train_steps_per_s"):
            continue
        rate = float(st[-1]["train_steps_per_s"]) * batch
        if rate > out.get(r["task"], (0.0, ""))[0]:
            out[r["task"]] = (rate, f"{r['model']} / {r['regime']}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--records", default="")
    ap.add_argument("--batch", type=int, default=16, help="the grid's training batch")
    ap.add_argument("--only", default="", help="comma-separated probe names")
    ap.add_argument("--options", default="", help='JSON options for --only, e.g. {"length": 32}')
    a = ap.parse_args()
    used = consumption(a.records, a.batch) if a.records else {}
    names = a.only.split(",") if a.only else list(probes.PROBES)
    print("| probe | settings | generated (sequences/s, wall) | per CPU second | training "
          "consumes (sequences/s, wall) | ratio (wall) |")
    print("|---|---|---|---|---|---|")
    for name in names:
        opts = dict(settings(name), **(json.loads(a.options) if a.options else {}))
        rate, per_cpu = throughput(name, a.num, a.repeats, **opts)
        use, who = used.get(name, (None, ""))
        shown = ", ".join(f"{k}={v}" for k, v in opts.items()) or "defaults"
        cons = f"{use:,.0f} ({who}, batch {a.batch})" if use else "–"
        ratio = f"{rate / use:,.0f}x" if use else "–"
        print(f"| {name} | {shown} | {rate:,.0f} | {per_cpu:,.0f} | {cons} | {ratio} |")


if __name__ == "__main__":
    main()
