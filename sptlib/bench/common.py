"""Shared measurement helpers: timing, compiled-memory and FLOP analysis, records, machine info.

Every measurement is one *record*, a flat JSON-serialisable dict printed as one line on stdout:

    name         what was measured (`s4d`, `attention_chunked`, `fft_conv`, `train/listops,s4`, ...)
    kind         `forward` | `forward_backward` | `train_step` | `matmul` | `pipeline` | `ratio`
                 | `scaling` | `skipped` | `error`
    length       sequence length (0 where none applies)
    tokens_per_s batch * length / seconds (0 where none applies)
    peak_bytes   peak memory of the compiled executable (see `compiled_peak_bytes`), or the
                 subprocess' max RSS above an idle JAX process with `--memory rss`
    seconds      median wall time of one call after warm-up
    target, target_op, target_ratio, target_met   where the issue sets a target (ratio =
                 measured / target, so for a `<=` target a ratio below 1 meets it)
"""

import json
import math
import os
import platform
import statistics
import sys
import time

import jax
import numpy as np

from sptlib.protocol import compare_jobs

# Where records go besides stdout (the CLI collects them for --markdown).
_SINKS = []


def emit(record):
    """Prints `record` as one JSON line on stdout (flushed) and hands it to the sinks."""
    rec = {k: _jsonable(v) for k, v in record.items()}
    for key, default in (("length", 0), ("tokens_per_s", 0.0), ("peak_bytes", 0),
                         ("seconds", 0.0)):
        rec.setdefault(key, default)
    print(json.dumps(rec, sort_keys=False), flush=True)
    for sink in _SINKS:
        sink(rec)
    return rec


def add_sink(fn):
    _SINKS.append(fn)


def _jsonable(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        v = float(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, tuple):
        return list(v)
    return v


def with_target(record, value, target, op=">="):
    """Adds target fields: `target_ratio` = value / target; met per `op` (`>=` or `<=`)."""
    record["target"] = target
    record["target_op"] = op
    record["target_ratio"] = round(value / target, 4) if target else None
    record["target_met"] = bool(value >= target if op == ">=" else value <= target)
    return record


# ---------------------------------------------------------------------------------------------
# Timing


def block(x):
    return jax.tree.map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready")
                        else a, x)


def time_call(fn, *args, repeats=5, warmup=1, max_seconds=20.0, min_repeats=2):
    """Median wall time (s) of `fn(*args)` after `warmup` calls, results `block_until_ready`.

    Stops early (after at least `min_repeats` timed calls) once the timed calls took
    `max_seconds` together, so long lengths stay affordable. When one warm-up call alone took
    more than 4 * max_seconds (an already compiled executable: no compilation in it), that call
    is the measurement.

    Returns (median wall s, all wall times, median process CPU s). The CPU time (all threads of
    this process) is what the call costs when other processes share the machine: on an idle
    machine with `cores` cores the wall time is at least cpu / cores.
    """
    dt = cpu = 0.0
    for _ in range(warmup):
        t0, c0 = time.perf_counter(), time.process_time()
        block(fn(*args))
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    if warmup and dt > 4 * max_seconds:
        return dt, [dt], cpu
    times, cpus = [], []
    total = 0.0
    for i in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        block(fn(*args))
        dt = time.perf_counter() - t0
        cpus.append(time.process_time() - c0)
        times.append(dt)
        total += dt
        if i + 1 >= min_repeats and total >= max_seconds:
            break
    return statistics.median(times), times, statistics.median(cpus)


def compile_timed(jitted, *args):
    """(compiled executable, seconds to lower + compile) of a `jax.jit` function for `args`."""
    t0 = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    return compiled, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# Memory and FLOPs from XLA


def compiled_peak_bytes(compiled):
    """Peak memory XLA's buffer assignment plans for one call of a compiled executable.

    arguments + outputs + temporaries - aliased (donated) bytes, from
    `compiled.memory_analysis()`: deterministic (no allocator noise, no other processes), and an
    upper bound on what the executable holds at once. None if the backend does not report it.
    """
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        return None
    if m is None:
        return None
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes)


def cost_flops(stage):
    """FLOPs from `cost_analysis()` of a Lowered or Compiled object (None if unavailable).

    Note: XLA counts the body of a while loop (`lax.scan`, `nn.scan` over layers) once, not once
    per iteration, so count FLOPs on an unrolled program (see train_step.py).
    """
    try:
        ca = stage.cost_analysis()
    except Exception:  # noqa: BLE001
        return None
    if isinstance(ca, (list, tuple)):
        ca = ca[0] if ca else None
    if not ca:
        return None
    f = ca.get("flops")
    return float(f) if f is not None and f > 0 else None


# ---------------------------------------------------------------------------------------------
# Machine


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def num_cores():
    return len(compare_jobs.usable_cores())


def machine_info():
    """Description of the machine and software, for the header of docs/benchmarks.md."""
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = None
    cores = num_cores()
    import flax
    return {
        "cpu": cpu_model(),
        "cores": cores,
        "memory_bytes": mem,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or _jaxlib_version(),
        "flax": flax.__version__,
        "python": sys.version.split()[0],
        "loadavg_start": load,
    }


def _jaxlib_version():
    try:
        import jaxlib
        return jaxlib.__version__
    except Exception:  # noqa: BLE001
        return None


def fmt_bytes(n):
    if n is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024.0
    return str(n)
