"""What `sptlib.aot` reads from libtpu's cost model, and its tables.

`compiler_bound(cost, spec)` turns `compiled.cost_analysis()` into the best-case step time and
XLA's FLOPs; `utilisation(rec, spec, mfu)` gives the model-FLOP bound, the compiler ratio and
chip-hours of a stage record from them (the definitions: the `sptlib.protocol.aot` docstring);
`format_row` / `markdown` print records (docs/benchmarks.md's table).
"""

from sptlib.slices import topologies


def _gib(n):
    return n / topologies.GIB


def compiler_bound(cost, spec):
    """libtpu's cost model of one compiled step (`compiled.cost_analysis()`, per chip).

    `optimal_seconds` is the step's time if every op ran at its roofline (peak FLOP/s or HBM
    bandwidth, whichever binds), with no stalls, no imperfect overlap and no launch overheads:
    a best case, not a prediction. A scanned loop's body is costed once (the rest of the step
    in full), so this is unbiased only for a step without such loops (`sptlib.protocol.aot`). A
    Pallas call is priced at the roofline of its declared `CostEstimate` (none: no cost); a
    negative or missing `optimal_seconds` means no estimate (e.g. `--effort=0`): None.
    Returns {xla_flops (all chips), bound_seconds}.
    """
    cost = cost or {}
    chip_flops = float(cost.get("flops", 0.0))
    seconds = float(cost.get("optimal_seconds", -1.0))
    ok = seconds > 0 and chip_flops > 0
    return {"xla_flops": chip_flops * spec.num_devices if cost else None,
            "bound_seconds": seconds if ok else None}


def utilisation(rec, spec, mfu):
    """The model-FLOP bound, compiler ratio and chip-hours of a record (module docstring) from
    its model_flops, bound_seconds, xla_flops and steps."""
    seconds, model, chips = rec.get("bound_seconds"), rec["model_flops"], spec.num_devices
    bound = model / (chips * seconds * spec.peak_flops) if seconds and model else None
    # An assumed MFU above the bound is impossible: capped, so the two form a range.
    used = min(mfu, bound) if bound else mfu
    return {"bound_mfu": bound,
            "compiler_ratio": rec["xla_flops"] / model if rec.get("xla_flops") and model
            else None,
            "chip_hours_bound": rec["steps"] * chips * seconds / 3600.0 if bound else None,
            "mfu": used, "mfu_assumed": mfu,
            "chip_hours": rec["steps"] * model / (spec.peak_flops * used) / 3600.0}


def _pct(x):
    return f"{x:.1%}" if x is not None else "n/a"


def format_row(r) -> str:
    capped = "assumed" if r["mfu"] == r.get("mfu_assumed", r["mfu"]) else "capped by the bound"
    ratio = f"{r['compiler_ratio']:.2f}" if r.get("compiler_ratio") else "n/a"
    return (f"{r['config']:<45} {r['stage']:<9} {r['slice']:<7} "
            f"{_gib(r['total_bytes']):6.1f}/{_gib(r['hbm_bytes']):.0f} GiB "
            f"(args {_gib(r['argument_bytes']):.2f}, temp {_gib(r['temp_bytes']):.2f}, "
            f"out {_gib(r['output_bytes']):.2f}, aliased {_gib(r['alias_bytes']):.2f}; "
            f"eval {_gib(r['eval_total_bytes']):.1f}) model {r['model_flops'] / 1e12:8.2f} "
            f"TFLOP/step {r['steps']:>8} steps; bound {_pct(r.get('bound_mfu'))} MFU "
            f"({r['bound_from']}; compiler FLOPs {ratio}x model), chip-h "
            f"{_hours(r.get('chip_hours_bound'))} (bound) / {r['chip_hours']:.1f} (at "
            f"{r['mfu']:.0%} MFU, {capped})  compile {r['compile_s']:.0f} s")


def _hours(h):
    return f"{h:,.1f}" if h is not None else "n/a"


def markdown(records, mfu) -> str:
    """The docs/benchmarks.md table: one row per task x model x stage."""
    lines = ["| task | model | stage | slice | memory/chip / HBM | model FLOPs/step | steps | "
             "best-case step (s) | MFU bound | compiler FLOPs / model FLOPs | chip-hours: bound "
             f"| chip-hours at {mfu:.0%} MFU (assumed; the bound where lower) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['config']} | | {r['stage']} | {r.get('slice', '')} | "
                         f"does not fit: {r['error']} | | | | | | | |")
            continue
        secs = f"{r['bound_seconds']:.4g}" if r.get("bound_seconds") else "n/a"
        ratio = f"{r['compiler_ratio']:.2f}" if r.get("compiler_ratio") else "n/a"
        lines.append(f"| {r['task']} | {r['model']} | {r['stage']} | {r['slice']} | "
                     f"{_gib(max(r['total_bytes'], r['eval_total_bytes'])):.1f} / "
                     f"{_gib(r['hbm_bytes']):.0f} GiB | {r['model_flops']:.3g} | "
                     f"{r['steps']:,} | {secs} | {_pct(r.get('bound_mfu'))} | {ratio} | "
                     f"{_hours(r.get('chip_hours_bound'))} | {_hours(r['chip_hours'])} |")
    return "\n".join(lines)
