"""Markdown tables of the accelerator benchmark's records (`sptlib.bench.accel`), one per
section, and the sptlib / PyTorch speed ratios."""

from sptlib.bench import common


TITLES = {"text": "Text Transformer pretraining step (sptlib vs PyTorch)",
          "attention": "Attention forward+backward", "s4d": "S4D block forward+backward",
          "steps": "Train steps"}


def _cell_bytes(rec):
    if not rec.get("peak_method"):
        return "not measured"
    return common.fmt_bytes(rec.get("peak_bytes")) + (
        f" (temp {common.fmt_bytes(rec['temp_bytes'])})" if rec.get("temp_bytes") else "")


def _row_line(rec):
    label = rec["row"] if rec["section"] != "text" else f"{rec['row']} B {rec['batch']}"
    if rec["kind"] != "accel":
        why = rec.get("error") or rec.get("reason", "")
        return (f"| {label} | {rec.get('shape', '—')} | {rec.get('dtype', '—')} | — | — | — | — "
                f"| {rec['kind']}: {why[:160].replace('|', '/')} |")
    ms = rec["seconds"] * 1e3
    tf = rec.get("tflops_per_s")
    tf = "—" if tf is None else (f"{tf:.3g}" if tf < 100 else f"{tf:.0f}")
    note = rec.get("note", "")
    comp = "—" if rec.get("compile_s") is None else f"{rec['compile_s']:.3g}"
    return (f"| {label} | {rec['shape']} | {rec['dtype']} | {ms:.4g} | {tf} | "
            f"{_cell_bytes(rec)} | {comp} | {note} |")


def ratios(records):
    """PyTorch seconds / sptlib seconds of each text and s4d pair (> 1: sptlib faster)."""
    out = []
    for sec, key in (("text", ("batch", "dtype")), ("s4d", ("length",))):
        rows = [r for r in records if r["section"] == sec and r["kind"] == "accel"]
        for ours in (r for r in rows if r["row"] == "sptlib"):
            theirs = [r for r in rows if r["row"] == "pytorch"
                      and all(r.get(k) == ours.get(k) for k in key)]
            if theirs:
                out.append({"section": sec, **{k: ours[k] for k in key},
                            "speedup": round(theirs[0]["seconds"] / ours["seconds"], 3)})
    return out


def render(records, machine=None):
    """Markdown tables of the report's records, one per section."""
    machine = machine or common.machine_info()
    lines = [f"Backend `{machine['backend']}` ({', '.join(machine['devices'][:2])}"
             f"{', ...' if len(machine['devices']) > 2 else ''}); jax {machine['jax']}, "
             f"jaxlib {machine['jaxlib']}, flax {machine['flax']}.", ""]
    for sec, title in TITLES.items():
        rows = [r for r in records if r.get("section") == sec]
        if not rows:
            continue
        lines += [f"#### {title}", "",
                  "| row | shape | dtype | ms | TFLOP/s | peak memory | compile s | note |",
                  "|---|---|---|---:|---:|---|---:|---|"]
        lines += [_row_line(r) for r in rows] + [""]
    rs = ratios(records)
    if rs:
        def label(r):
            return (f"text B {r['batch']} {r['dtype']}" if r["section"] == "text"
                    else f"S4D L {r['length']}")
        lines.append("sptlib speed ÷ PyTorch (PyTorch seconds / sptlib seconds): " + "; ".join(
            f"{label(r)}: **{r['speedup']:.3g}×**" for r in rs) + ".")
        lines.append("")
    return "\n".join(lines) + "\n"
