"""Metric accumulation across steps, and the TensorBoard event writer (no TensorFlow).

Train and eval steps return `{name: (sum, count)}` pairs summed over the global batch (the
objective's convention), or plain scalars (e.g. a learning rate) which are averaged over steps.
Accumulation stays on device (`accumulate`, jitted) so that logging costs one transfer per
`log_every` steps instead of a host sync per step.

`EventWriter` writes TensorBoard scalars with tensorboardX's protocol buffers and record framing,
through epath (local folders and gs:// alike), so training needs no TensorFlow.
"""

import math
import socket
import struct
import time
from typing import Any, Optional

from absl import logging
from etils import epath
import jax
import jax.numpy as jnp
import numpy as np

from sptlib import console


def _as_pair(value):
    """(sum, count) of one metric value: a (sum, count) pair, or a scalar counted once."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return (jnp.asarray(value[0], jnp.float32), jnp.asarray(value[1], jnp.float32))
    return (jnp.asarray(value, jnp.float32), jnp.ones((), jnp.float32))


@jax.jit
def _add(acc, new):
    return jax.tree.map(jnp.add, acc, new)


def accumulate(acc: Optional[dict], metrics: dict) -> dict:
    """Adds one step's metrics to the running (device-side) `{name: (sum, count)}` sums."""
    new = {k: _as_pair(v) for k, v in metrics.items()}
    if acc is None:
        return new
    if set(acc) != set(new):
        # A metric appearing or disappearing mid-window: merge key by key on the host.
        out = dict(acc)
        for k, v in new.items():
            out[k] = _add(out[k], v) if k in out else v
        return out
    return _add(acc, new)


def summarize(acc: Optional[dict]) -> dict:
    """Host dict `{name: sum / count}` (NaN where the count is 0)."""
    if not acc:
        return {}
    host = jax.device_get(acc)
    out = {}
    for k, (s, n) in host.items():
        s, n = float(np.asarray(s)), float(np.asarray(n))
        out[k] = s / n if n > 0 else float("nan")
    return out


def format_metrics(values: dict, keys=None) -> str:
    keys = sorted(values) if keys is None else [k for k in keys if k in values]
    return " ".join(f"{k}={values[k]:.4g}" for k in keys)


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class EventWriter:
    """TensorBoard scalars in one `events.out.tfevents.<time>.<host>` file of `logdir`.

    Records are framed as TensorBoard reads them (length, masked CRC-32C of it, the serialised
    `Event`, masked CRC-32C of it). A local file is appended to on every write; an object store
    (gs://) cannot append, so the whole file is rewritten at most every `remote_flush_s` and on
    `flush` / `close` (a scalar costs ~50 bytes: a long run's file stays small).
    """

    def __init__(self, logdir, *, remote_flush_s: float = 60.0):
        from tensorboardX.proto import event_pb2, summary_pb2  # light: protobuf only, no TF
        from tensorboardX.record_writer import masked_crc32c
        self._event, self._summary, self._crc = event_pb2.Event, summary_pb2.Summary, masked_crc32c
        logdir = epath.Path(logdir)
        logdir.mkdir(parents=True, exist_ok=True)
        self.path = logdir / f"events.out.tfevents.{time.time():.0f}.{socket.gethostname()}"
        self._remote = "://" in str(logdir)
        self._remote_flush_s, self._last_flush = remote_flush_s, time.monotonic()
        self._records: list[bytes] = []   # everything (remote) or what is not written (local)
        self._append(self._event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def _append(self, event) -> None:
        data = event.SerializeToString()
        header = struct.pack("<Q", len(data))
        self._records.append(header + struct.pack("<I", self._crc(header)) + data
                             + struct.pack("<I", self._crc(data)))

    def write_scalars(self, step: int, scalars: dict[str, Any]) -> None:
        values = [self._summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()]
        self._append(self._event(wall_time=time.time(), step=int(step),
                                 summary=self._summary(value=values)))
        if not self._remote or time.monotonic() - self._last_flush >= self._remote_flush_s:
            self.flush()

    def flush(self) -> None:
        if self._remote:
            self.path.write_bytes(b"".join(self._records))
        elif self._records:
            with self.path.open("ab") as f:
                f.write(b"".join(self._records))
            self._records = []
        self._last_flush = time.monotonic()

    def close(self) -> None:
        self.flush()


class _NoWriter:
    """Processes other than 0 write no event file (process 0 writes the global metrics)."""

    def write_scalars(self, step, scalars):
        del step, scalars

    def flush(self):
        pass

    def close(self):
        pass


def create_writer(logdir, *, is_main: bool):
    """The stage's TensorBoard writer: `EventWriter(logdir)` on process 0, a no-op elsewhere."""
    return EventWriter(logdir) if is_main else _NoWriter()


class Progress:
    """Steps/s and ETA of the current run (counted from the step it started or resumed at): the
    INFO lines of the log file and, on a terminal, the stage's progress bar (`sptlib.console`)."""

    def __init__(self, start_step: int, total_steps: int, clock, name: str = "",
                 show: bool = True):
        self._clock = clock
        self.total = total_steps
        self.name = name
        self._t0 = clock()
        self._s0 = start_step
        self._last_t, self._last_s = self._t0, start_step
        self.bar = console.Bar(f"[{name}]", start_step, total_steps, show=show)

    def line(self, step: int) -> str:
        now = self._clock()
        window = now - self._last_t
        rate = (step - self._last_s) / window if window > 0 else float("nan")
        overall = (step - self._s0) / (now - self._t0) if now > self._t0 else float("nan")
        eta = (self.total - step) / overall if overall and overall > 0 else float("nan")
        self._last_t, self._last_s = now, step
        return (f"step {step}/{self.total} ({100.0 * step / self.total:.0f}%) "
                f"{rate:.2f} steps/s, ETA {format_duration(eta)}")

    def log(self, step: int, values: dict) -> None:
        """A training window's metrics (`summarize`d): one INFO line, and the bar moves."""
        logging.info("[%s] %s | %s", self.name, self.line(step), format_metrics(values))
        self.bar.update(step, **({"loss": values["loss"]} if "loss" in values else {}))

    def validation(self, step: int, values: dict, metric: str) -> None:
        logging.info("[%s] step %d validation: %s", self.name, step, format_metrics(values))
        if metric in values:
            self.bar.update(step, **{f"val_{metric}": values[metric]})

    def finish(self, text: str) -> None:
        """Closes the bar; `text` (the stage's result) to stdout and the log file."""
        self.bar.close()
        console.result(f"[{self.name}] {text}", stage=True)

    def rate(self) -> float:
        return (self._last_s - self._s0) / (self._last_t - self._t0) \
            if self._last_t > self._t0 else float("nan")


def scalars_for_writer(prefix: str, values: dict) -> dict[str, Any]:
    return {f"{prefix}/{k}": float(v) for k, v in values.items()}
