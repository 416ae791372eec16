"""What a run writes to `results.json`: typed records, one atomic JSON writer, one reader.

Two files have the name:

    workdir/<stage>/results.json   `StageResults`: written by the trainer (`sptlib.train.loop`)
                                   when the stage finishes or diverges;
    workdir/results.json           `RunResults`: the stage runner's summary (`sptlib.protocol.stages`).

The JSON keys are the dataclass fields, so runs finished before these classes existed read the
same. No JAX here: `sptlib.protocol.compare` reads results without loading the trainer.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import tempfile
from typing import Any, Optional

from etils import epath

from sptlib.errors import ResultsDigestError, ResultsError

RESULTS_FILE = "results.json"
# What the runner's summary keeps of each stage, beside `objective` and the best metric's
# `validation_<m>_best`, `test_<m>_best` and `test_<m>_last`.
SUMMARY_KEYS = ("status", "final_step", "best_step", "best_metric", "params_fingerprint",
                "wall_time_s", "init")
_DIVERGED_KEYS = ("stage", "status", "final_step", "last_good_step", "message")


def write_json(path, obj: Any, *, indent: int = 2, sort_keys: bool = True) -> None:
    """Writes `obj` to `path` so that no reader sees half a file and no planted symlink is
    followed: a temporary file of a fresh name beside it (`tempfile`, `O_EXCL`, mode 0600 until
    written), then `os.replace`, which replaces a symlink at `path` instead of writing through
    it (on object stores, `gs://...`, a single write). NumPy/JAX scalars are written as numbers,
    sets as lists, anything else unknown as its `str`."""
    write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, default=_json_default))


def write_text(path, text: str) -> None:
    """`text` into `path` as `write_json` writes (whole or not at all; a planted symlink at
    `path` is replaced, never written through); gs://... in a single write."""
    write_bytes(path, text.encode())


def write_bytes(path, data: bytes) -> None:
    """`data` into `path` as `write_text` writes (e.g. a PNG)."""
    path = epath.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if "://" in str(path):
        path.write_bytes(data)
        return
    write_private_then_replace(str(path), data)


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask would, for every thread)
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def write_private_then_replace(path: str, data: bytes, mode: Optional[int] = None) -> None:
    """`data` into `path` through a fresh temporary file in the same folder (never a fixed
    name another user could have planted as a symlink), then `os.replace`. The final file gets
    `mode` (default 0666 less the umask); a failure (e.g. a full disk) leaves no temporary."""
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), 0o666 & ~_umask() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError) and e.filename in (None, tmp):
            e.filename = path  # a full disk names the file meant, not the temporary
        raise


def _json_default(x):
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (tuple, set)):
        return list(x)
    return str(x)


def read_text_no_link(path) -> str:
    """The text of `path`, never read through a symlink at `path` itself (a link planted in the
    workdir, e.g. to another run's or another user's file): that is a `ResultsError` that calls
    it a link. gs://... reads as usual (object stores have no links)."""
    if "://" in str(path):
        return epath.Path(path).read_text()
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):
            raise ResultsError(
                f"{path} is a symbolic link (to {os.readlink(path)}), not a file a run wrote: "
                f"not read through. Remove the link (the same command then rebuilds the file "
                f"from the checkpoints)") from None
        raise
    with os.fdopen(fd, "rb") as f:
        return f.read().decode("utf-8")


def read_json(path) -> Any:
    """The JSON in `path`; a truncated or malformed file is a `ResultsError` naming it, and so
    is a symlink at `path` (`read_text_no_link`)."""
    path = epath.Path(path)
    try:
        return json.loads(read_text_no_link(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResultsError(
            f"{path} is unreadable ({e}; truncated by a kill?). Nothing else is lost: move it "
            f"aside (e.g. to {path.name}.bad) and rerun the same command, which rebuilds it from "
            f"the checkpoints") from e


DIGEST_KEY = "digest"  # SHA-256 of the rest of a results file, written with it


def _canonical(obj) -> dict:
    """`obj` as it reads back from its JSON (NumPy scalars as numbers, tuples as lists)."""
    return json.loads(json.dumps(obj, default=_json_default))


def content_digest(data: dict) -> str:
    """SHA-256 of a results object without its `digest` key: what a reader recomputes."""
    rest = {k: v for k, v in data.items() if k != DIGEST_KEY}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":"),
                                     default=_json_default).encode()).hexdigest()


def sealed(obj: dict) -> dict:
    """`obj` with its `digest`: the results as written by the trainer or the runner, so that a
    number edited (or damaged) since reads as such, not as a result. The digest covers
    `params_fingerprint` and `best_step`, which tie the numbers to their checkpoints."""
    out = _canonical(obj)
    out[DIGEST_KEY] = content_digest(out)
    return out


def check_digest(data, path) -> None:
    """`ResultsDigestError` when `data` (read from `path`) carries a digest it does not match.
    Files written before digests (no `digest` key) are accepted as they are."""
    if isinstance(data, dict) and DIGEST_KEY in data and \
            content_digest(data) != data[DIGEST_KEY]:
        raise ResultsDigestError(
            f"{path}: its numbers differ from the digest written with them (edited or damaged "
            f"since); not reported. Rerun the same command: a stage's metrics are recomputed "
            f"from its checkpoints")


def _from_json(cls, data, where, **extra):
    """`cls` from a JSON object; keys that are no field (the summary's extras) are ignored."""
    if not isinstance(data, dict):
        raise ResultsError(f"{where}: expected a JSON object, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{**{k: v for k, v in data.items() if k in names}, **extra})
    except TypeError as e:  # a required field is missing
        raise ResultsError(f"{where}: not a {cls.__name__} ({e})") from e


@dataclasses.dataclass
class StageResults:
    """One stage's `results.json`. A finished stage (`status="finished"`) writes every field but
    `last_good_step` and `message`; a diverged one (`status="diverged"`) only `stage`, `status`,
    `final_step`, `last_good_step` and `message`. `status="absent"`: no results at all."""

    stage: str
    status: str
    final_step: Optional[int] = None
    best_step: Optional[int] = None
    best_metric: Optional[str] = None  # the validation metric that picks the best checkpoint
    best_mode: Optional[str] = None  # max | min
    validation: dict = dataclasses.field(default_factory=dict)  # {"best": metrics, "last": ...}
    test: dict = dataclasses.field(default_factory=dict)  # the same, on the test split
    history: list = dataclasses.field(default_factory=list)  # [{"step": s, metric: value}]
    params_fingerprint: Optional[str] = None  # SHA-256 of the last parameters' digests
    num_params: Optional[int] = None
    flops_per_step: Optional[float] = None  # one train step on the global batch
    init: dict = dataclasses.field(default_factory=dict)  # kind: resume | init_from | random
    resumed_at_step: int = 0
    train_steps_per_s: Optional[float] = None
    wall_time_s: Optional[float] = None  # this invocation
    wall_time_total_s: Optional[float] = None  # every invocation, resumed ones included
    # Training to convergence (sptlib.train.convergence): "patience" | "cap"; None: fixed budget.
    stop_reason: Optional[str] = None
    last_good_step: Optional[int] = None  # diverged: the last checkpoint kept
    message: str = ""  # diverged: what happened and what to change

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    def metric(self, split: str, which: str, name: str) -> Optional[float]:
        """`split` (validation | test) metric `name` of the `which` (best | last) checkpoint."""
        return ((getattr(self, split) or {}).get(which) or {}).get(name)

    def wall_time(self) -> Optional[float]:
        """Every invocation's wall time (the summary entries hold this invocation's only)."""
        return self.wall_time_s if self.wall_time_total_s is None else self.wall_time_total_s

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        if self.status == "diverged":
            return {k: out[k] for k in _DIVERGED_KEYS}
        # stop_reason only where a stage trained to convergence: fixed-budget files stay as they were
        return {k: v for k, v in out.items() if k not in ("last_good_step", "message")
                and not (k == "stop_reason" and v is None)}

    @classmethod
    def from_json(cls, data, where: str = "results", **extra) -> "StageResults":
        return _from_json(cls, data, where, **extra)

    def summary(self, objective: str) -> dict:
        """This stage's entry in the runner's `RunResults.stages`."""
        m = self.best_metric
        out = {k: getattr(self, k) for k in SUMMARY_KEYS}
        out.update({"objective": objective,
                    f"validation_{m}_best": self.metric("validation", "best", m),
                    f"test_{m}_best": self.metric("test", "best", m),
                    f"test_{m}_last": self.metric("test", "last", m)})
        return out


@dataclasses.dataclass
class RunResults:
    """The run's `results.json`: the runner's summary of every stage it reached."""

    stage_order: list
    stages: dict  # {name: StageResults.summary(objective)}
    complete: bool = False  # every stage of `stage_order` finished
    wall_time_s: Optional[float] = None  # the runner's last invocation
    # Examples per split, and the counted skips (truncated at max_length, empty images).
    data: Optional[dict] = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data, where: str = "results") -> "RunResults":
        return _from_json(cls, data, where)

    def stage(self, name: str) -> Optional[StageResults]:
        """The summary's entry of stage `name` (fewer fields than the stage's own file)."""
        entry = self.stages.get(name)
        if not isinstance(entry, dict):
            return None
        return StageResults.from_json(entry, f"results.json stages.{name}", stage=name)


def read_stage(stage_dir) -> Optional[StageResults]:
    """`stage_dir/results.json`, or None when there is none; `ResultsError` when unreadable,
    `ResultsDigestError` when it differs from its digest."""
    path = epath.Path(stage_dir) / RESULTS_FILE
    if not path.exists():
        return None
    data = read_json(path)
    check_digest(data, path)
    return StageResults.from_json(data, str(path))


def read_run(workdir) -> Optional[RunResults]:
    """`workdir/results.json`, or None when there is none; `ResultsError` when unreadable."""
    path = epath.Path(workdir) / RESULTS_FILE
    if not path.exists():
        return None
    data = read_json(path)
    check_digest(data, path)
    return RunResults.from_json(data, str(path))


def nested_diffs(old, new, prefix=""):
    """[(dotted key, old, new)] for every leaf that differs between two nested dicts (sorted):
    what a saved description (results, resolved config) and the current one disagree on."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += nested_diffs(old.get(k), new.get(k), f"{prefix}.{k}" if prefix else k)
        return out
    return [] if old == new else [(prefix, old, new)]
