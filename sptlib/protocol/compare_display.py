"""What `python -m sptlib.compare` prints (`sptlib.console`): a line when it starts, one per
finished run, then where the outputs are and the test-accuracy table; everything else goes to
the log files (`<workdir>/log.txt`, each run's `log.txt`).

With `--jobs` the workers print nothing but warnings and errors: the parent reads the records
they write after every run (`comparison.shard<i>of<n>.json`) and prints their lines itself
(`ShardWatch`), under one progress bar over the runs where stderr is a terminal.
"""

from __future__ import annotations

import json
import os
import time

from etils import epath

from sptlib import console
from sptlib.train import metrics as metrics_lib

# The sections of comparison.md printed on stdout (the rest: the file and the plots).
PRINTED_SECTIONS = ("Test accuracy", "Gain of SPT / mlpinit (points)")


def start_line(total: int, todo: int, jobs: int, workdir: str, *, shard=None) -> str:
    where = f"in {jobs} processes" if jobs > 1 else "in this process"
    part = "" if shard is None else f" (shard {shard[0]}/{shard[1]})"
    log = "" if "://" in str(workdir) else (
        f"; details in {os.path.join(workdir, console.LOG_FILE)} and each run's log.txt")
    return (f"[compare] {total} runs{part}, {total - todo} finished before, {todo} to run "
            f"{where}{log}")


def run_line(i: int, n: int, name: str, rec: dict) -> str:
    """`[compare] 3/18 s4d/scratch/seed0: test accuracy 100.00% (1m05s)`: one run's outcome."""
    status = rec.get("status")
    if status == "finished":
        acc = rec.get("test_accuracy")
        what = "finished" if acc is None else f"test accuracy {100 * acc:.2f}%"
    elif status == "failed":
        what = f"FAILED: {rec.get('error', '?')} (traceback in its error.txt)"
    elif rec.get("error"):
        what = f"SKIPPED: {rec['error']}"
    else:
        what = "not finished"
    wall = rec.get("wall_time_s")
    took = f" ({metrics_lib.format_duration(wall)})" if wall else ""
    return f"[compare] {i}/{n} {name}: {what}{took}"


class ShardWatch:
    """`--jobs`' parent: called every half second (`compare_jobs.run_shards(poll=...)`), prints
    a line for every run the workers finished (or failed) since the command started."""

    def __init__(self, workdir: str, jobs: int, todo: int, clock=time.time):
        self.workdir = str(workdir)
        self.files = [epath.Path(workdir) / f"comparison.shard{i}of{jobs}.json"
                      for i in range(jobs)]
        self.t0 = clock()
        self.todo = todo
        self.seen: set = set()
        self.bar = console.Bar("[compare]", 0, todo, unit="run")

    def __call__(self) -> None:
        for f in self.files:
            for rec in self._records(f):
                key = rec.get("workdir")
                if key in self.seen or rec.get("status") == "missing" or self._before(rec):
                    continue
                self.seen.add(key)
                name = os.path.relpath(key, self.workdir) if "://" not in self.workdir else key
                console.result(run_line(len(self.seen), self.todo, name, rec))
                self.bar.update(len(self.seen))
        if len(self.seen) >= self.todo:
            self.bar.close()

    def _records(self, f) -> list:
        try:
            if f.stat().mtime < self.t0 - 1:  # a file of an earlier command
                return []
            return json.loads(f.read_text())
        except (OSError, ValueError, AttributeError):  # not written yet, or being replaced
            return []

    def _before(self, rec) -> bool:
        """A run finished by an earlier command (a shard lists those too)."""
        if rec.get("status") != "finished":
            return False
        try:
            done = epath.Path(rec["workdir"]) / "results.json"
            return done.stat().mtime < self.t0 - 1
        except (OSError, AttributeError, KeyError):
            return False


def summary(paths: dict, workdir: str) -> str:
    """Where the outputs are, then the printed sections of the report."""
    lines = ["", f"Table:   {paths['markdown']}", f"Records: {paths['json']}"]
    lines += [f"Plot:    {v}" for k, v in paths.items() if k not in ("markdown", "json")]
    if "://" not in str(workdir):
        lines.append(f"Log:     {os.path.join(workdir, console.LOG_FILE)}")
    text = epath.Path(paths["markdown"]).read_text()
    lines += ["", *_sections(text, PRINTED_SECTIONS)]
    lines.append(f"(the validation accuracy, gaps, compute and learning curves: "
                 f"{paths['markdown']})")
    return "\n".join(lines)


def _sections(markdown: str, titles) -> list[str]:
    """The report's title and intro, and the sections whose heading is one of `titles`."""
    out, keep = [], True
    for line in markdown.rstrip().splitlines():
        if line.startswith("## ") or line.startswith("### "):
            keep = line.lstrip("#").strip() in titles
        if keep:
            out.append(line)
    return out
