"""Metric accumulation across steps and the clu metric writers (TensorBoard + log).

Train and eval steps return `{name: (sum, count)}` pairs summed over the global batch (the
objective's convention), or plain scalars (e.g. a learning rate) which are averaged over steps.
Accumulation stays on device (`accumulate`, jitted) so that logging costs one transfer per
`log_every` steps instead of a host sync per step.
"""

import math
import threading
from typing import Any, Optional

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np


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


_preload = None


def preload_writer_backend():
    """Starts importing clu's writers (TensorFlow, ~5-8 s of CPU) in a background thread.

    Called at the start of a stage so the import overlaps data loading and XLA compilation
    (which release the GIL) instead of delaying the first step.
    """
    global _preload
    if _preload is None:
        def _import():
            try:
                from clu import metric_writers  # noqa: F401  pylint: disable=unused-import
            except Exception:  # pylint: disable=broad-except
                pass  # the real import in create_writer raises with the reason
        _preload = threading.Thread(target=_import, name="clu-writer-import", daemon=True)
        _preload.start()


def create_writer(logdir, *, is_main: bool):
    """clu writer: TensorBoard events in `logdir` plus log lines on process 0; logs elsewhere."""
    if _preload is not None:
        _preload.join()
    from clu import metric_writers  # imports TensorFlow/TensorBoard: keep it lazy
    if not is_main:
        return metric_writers.create_default_writer(just_logging=True, asynchronous=False)
    return metric_writers.create_default_writer(str(epath.Path(logdir)), asynchronous=True)


class Progress:
    """Steps/s and ETA of the current run (counted from the step it started or resumed at)."""

    def __init__(self, start_step: int, total_steps: int, clock):
        self._clock = clock
        self.total = total_steps
        self._t0 = clock()
        self._s0 = start_step
        self._last_t, self._last_s = self._t0, start_step

    def line(self, step: int) -> str:
        now = self._clock()
        window = now - self._last_t
        rate = (step - self._last_s) / window if window > 0 else float("nan")
        overall = (step - self._s0) / (now - self._t0) if now > self._t0 else float("nan")
        eta = (self.total - step) / overall if overall and overall > 0 else float("nan")
        self._last_t, self._last_s = now, step
        return (f"step {step}/{self.total} ({100.0 * step / self.total:.0f}%) "
                f"{rate:.2f} steps/s, ETA {format_duration(eta)}")

    def rate(self) -> float:
        return (self._last_s - self._s0) / (self._last_t - self._t0) \
            if self._last_t > self._t0 else float("nan")


def scalars_for_writer(prefix: str, values: dict) -> dict[str, Any]:
    return {f"{prefix}/{k}": float(v) for k, v in values.items()}
