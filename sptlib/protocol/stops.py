"""Where the stages of a grid trained to convergence stopped: a section of `comparison.md`.

Reads the records of `sptlib.protocol.records.make_record` (per stage `steps`, `stop_reason`:
"patience" | "cap" | None, `best_step`); lists per (data fraction, model, regime) and stage the
step each seed stopped at, marking the runs that reached their cap (the cap, not convergence,
ended them) and the equal-compute runs' budgets (the steps their SPT run spent).
"""

from __future__ import annotations

from typing import Sequence

from sptlib.protocol.records import finished


def rows(records: Sequence[dict]) -> list[dict]:
    """One row per (data fraction, model, regime, stage) of finished runs, in the records' order:
    `steps` and `best` ([per seed]), `reasons`, `seeds`; empty when no stage trained to
    convergence."""
    recs = finished(records)
    if not any(st.get("stop_reason") for r in recs for st in r.get("stages", {}).values()):
        return []
    out = {}
    for r in sorted(recs, key=lambda r: r["seed"]):
        for name, st in r.get("stages", {}).items():
            key = (r.get("data_fraction", 1.0), r["model"], r["regime"], name)
            row = out.setdefault(key, dict(zip(("data_fraction", "model", "regime", "stage"),
                                               key), seeds=[], steps=[], best=[], reasons=[],
                                           matched=bool(r.get("steps_matched_to"))))
            row["seeds"].append(r["seed"])
            row["steps"].append(st.get("steps"))
            row["best"].append(st.get("best_step"))
            row["reasons"].append(st.get("stop_reason"))
    return list(out.values())


def markdown(records: Sequence[dict]) -> str:
    """The section, or "" when no stage trained to convergence."""
    rs = rows(records)
    if not rs:
        return ""
    lines = ["## Where the stages stopped", "",
             "Training to convergence (`stages.<s>.patience`): the step each seed's stage stopped "
             "at (seeds in order) and its best-validation step; `*` = it reached the step cap "
             "(the cap, not convergence, ended it); `=` = equal compute, a fixed budget: the "
             "steps its seed's SPT run spent. `at cap` counts the runs the cap ended.", "",
             "| fraction | model | regime | stage | stop step | best step | at cap |",
             "|---|---|---|---|---|---|---|"]
    for row in rs:
        mark = {"cap": "*", "patience": "", None: "="}
        stops = ", ".join(f"{s}{mark.get(x, '')}" for s, x in zip(row["steps"], row["reasons"]))
        capped = sum(1 for x in row["reasons"] if x == "cap")
        conv = [x for x in row["reasons"] if x is not None]
        lines.append(f"| {row['data_fraction']:g} | {row['model']} | {row['regime']} | "
                     f"{row['stage']} | {stops} | {', '.join(map(str, row['best']))} | "
                     f"{f'{capped}/{len(conv)}' if conv else '–'} |")
    return "\n".join(lines + [""])
