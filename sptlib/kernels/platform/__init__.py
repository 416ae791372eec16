"""Platform kernels: the one place where the kernel behind an algorithm is chosen by platform.

Layers, models and configs name *algorithms* (attention ``plain`` / ``chunked`` / ``local``, an
FFT convolution, S4's generating function, a dense layer). The jnp functions in
`sptlib.kernels` are their reference implementations and run everywhere; this package adds, per
platform, the fused kernels that compute the same functions faster:

    platform  attention (plain, chunked, local)          convolution / S4 / dense weight grad
    cpu       cpu/attention.py (C++, plain only)          cpu/conv.py, cpu/s4.py, cpu/linear.py
    gpu       gpu.py: cuDNN flash attention (bf16/fp16),  jnp (XLA)
              gpu_band.py: Pallas (Triton) flash kernel
              for bidirectional windows and fp32
    tpu       tpu.py: Pallas splash attention             kernels/fftmm.py: the FFT convolution as
                                                          DFT matmuls (`fft_matmul`); else jnp

The platform is the one the step is traced for: the devices of the mesh in context
(`jax.set_mesh`, as every sptlib step is traced), else JAX's default backend. So
`sptlib.protocol.aot` on a CPU host traces TPU kernels for a TPU slice, and nothing CPU-specific is
probed on a TPU or GPU host. The chosen kernel is wrapped in `jax.lax.platform_dependent` with
the jnp reference as the default branch, so a program lowered for another platform still gets
the reference. `SPTLIB_NATIVE=0` turns the CPU kernels off (the reference then runs on CPU:
what CI tests as the accelerator path); `attention(..., kernel="reference")` forces the jnp
attention anywhere (benchmarks, tests).

`prepare_process()` is what the command-line programs call first: on CPU hosts it re-executes
the process with glibc malloc settings that keep XLA:CPU's buffers (`cpu/hostmem.py`).
"""

import contextlib
import functools
import os

import jax
import jax.numpy as jnp

from sptlib.kernels import attention as reference

ALGORITHMS = ("plain", "chunked", "local")
KERNELS = ("auto", "reference")


def target_platform():
    """`cpu` | `gpu` | `tpu` (or another JAX platform name) the current trace is for."""
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.abstract_device is not None:
        return mesh.abstract_device.platform
    return jax.default_backend()


def cpu_kernels(where=None):
    """Whether the C++ XLA:CPU kernels are used in this trace (or on platform `where`): it is
    for the CPU, they are not turned off (`SPTLIB_NATIVE=0`) and they compiled (`cpu/build.py`)."""
    if os.environ.get("SPTLIB_NATIVE", "1") == "0" or (where or target_platform()) != "cpu":
        return False
    from sptlib.kernels.platform.cpu import build  # deferred: never loaded off CPU
    return build.available()


@contextlib.contextmanager
def reference_kernels():
    """Within it, every kernel traced is the jnp reference (as `SPTLIB_NATIVE=0`): for counting
    a program's FLOPs, which neither XLA nor the jaxpr counter sees inside a custom call."""
    old = os.environ.get("SPTLIB_NATIVE")
    os.environ["SPTLIB_NATIVE"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SPTLIB_NATIVE", None)
        else:
            os.environ["SPTLIB_NATIVE"] = old


def cpu_kernels_unavailable_reason():
    """Why the CPU kernels are off ('' when they are used on this CPU)."""
    if os.environ.get("SPTLIB_NATIVE", "1") == "0":
        return "turned off by SPTLIB_NATIVE=0"
    from sptlib.kernels.platform.cpu import build  # deferred: never loaded off CPU
    return build.unavailable_reason()


def on_platforms(default, *args, cpu=None, cuda=None, rocm=None, tpu=None):
    """`default(*args)`, or the given platform's kernel where the program is lowered for it."""
    branches = {k: f for k, f in dict(cpu=cpu, cuda=cuda, rocm=rocm, tpu=tpu).items() if f}
    if not branches:
        return default(*args)
    return jax.lax.platform_dependent(*args, default=default, **branches)


# ---------------------------------------------------------------------------------------------
# The SSMs' long convolution as DFT matmuls (`sptlib.kernels.fftmm`)
# ---------------------------------------------------------------------------------------------

def fft_matmul(where=None):
    """Whether the SSMs' FFT convolutions (`sptlib.kernels.conv`) run as four-step DFT matmuls
    (`sptlib.kernels.fftmm`) in this trace (or on platform `where`): on TPU, whose FFT op does
    not use the MXU; elsewhere the FFT (CPU: its native kernel, GPU: cuFFT).
    `SPTLIB_FFT_MATMUL=1` forces the matmul form anywhere (CPU tests, accuracy runs), `=0` off."""
    flag = os.environ.get("SPTLIB_FFT_MATMUL", "auto")
    if flag not in ("auto", "0", "1"):
        raise ValueError(f"SPTLIB_FFT_MATMUL={flag!r}: use auto (TPU only), 1 (on) or 0 (off)")
    if flag != "auto":
        return flag == "1"
    return (where or target_platform()) == "tpu"


def fft_matmul_precision():
    """`SPTLIB_FFT_MATMUL_PRECISION` (one of `sptlib.kernels.fftmm.PRECISIONS`; fftmm refuses by
    name a precision beyond its error bound), or None for fftmm's default."""
    return os.environ.get("SPTLIB_FFT_MATMUL_PRECISION") or None


# ---------------------------------------------------------------------------------------------
# The CPU kernels (each imported on first use only)
# ---------------------------------------------------------------------------------------------

def cpu_circular_conv(u, kc):
    from sptlib.kernels.platform.cpu import conv  # deferred: never loaded off CPU
    return conv.circular_conv(u, kc)


def cpu_s4_spectrum(v, lam, dt, z):
    from sptlib.kernels.platform.cpu import s4  # deferred: never loaded off CPU
    return s4.spectrum(v, lam, dt, z)


def cpu_weight_grad(x, g):
    from sptlib.kernels.platform.cpu import linear  # deferred: never loaded off CPU
    return linear.weight_grad(x, g)


def prepare_process():
    """First call of a command-line program: on CPU hosts, re-executes it with malloc tunables
    that keep freed buffers (`cpu/hostmem.py`); returns where there is nothing to do."""
    from sptlib.kernels.platform.cpu import hostmem  # deferred: a JAX-free OS-level switch
    hostmem.reexec_with_malloc_tunables()


# ---------------------------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------------------------

def attention_kernel(where, *, algorithm="plain", dtype="float32", head_dim=64, causal=False,
                     window=0, kernel="auto"):
    """The name of the kernel `attention` runs for these arguments on platform `where`:
    ``cpu`` (the C++ kernel), ``cudnn``, ``pallas`` (GPU), ``splash`` or ``reference`` (jnp)."""
    if kernel == "reference":
        return "reference"
    if where == "cpu":
        return "cpu" if algorithm == "plain" and cpu_kernels(where) else "reference"
    if where == "gpu":
        from sptlib.kernels.platform import gpu  # deferred: GPU only
        return gpu.choice(dtype, head_dim, causal=causal, window=window) or "reference"
    if where == "tpu":
        return "splash"
    return "reference"


def attention(q, k, v, key_mask=None, *, causal=False, window=0, algorithm="plain",
              chunk_size=512, kernel="auto", spec=None):
    """Softmax attention by `algorithm`, computed by the kernel of the platform it runs on.

    Args:
      q, k, v: `[batch, length, heads, head_dim]` (q pre-scaled by 1/sqrt(head_dim)).
      key_mask: bool `[batch, length]`, True at real keys; padding keys get weight exactly 0.
      causal: query i sees keys j <= i only.
      window: if > 0, query i sees keys with |i - j| <= window (0 <= i - j <= window if causal).
      algorithm: ``plain`` (one score matrix), ``chunked`` (exact online softmax, memory linear
        in length) or ``local`` (chunked, visiting only the band; needs window > 0). Every
        fused kernel computes the same function; on accelerators they are all flash-style, so
        the algorithm is the reference's memory behaviour and the kernel's mask.
      chunk_size: chunk length of the jnp chunked/local reference.
      kernel: ``auto`` (the platform's kernel where one applies) | ``reference`` (jnp).
      spec: `PartitionSpec` of q/k/v under the mesh in context (the layer's logical axes), for
        kernels that run per shard (TPU); None: batch over the mesh.
    Returns:
      `[batch, length, heads, head_dim]` in v's dtype.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"attention algorithm {algorithm!r} not in {ALGORITHMS}")
    if kernel not in KERNELS:
        raise ValueError(f"attention kernel {kernel!r} not in {KERNELS}")
    if algorithm == "plain":
        ref = functools.partial(reference.dot_product_attention, causal=causal, window=window)
    else:
        ref = functools.partial(reference.chunked_attention, causal=causal, window=window,
                                chunk_size=chunk_size)
    mask = jnp.ones(q.shape[:2], bool) if key_mask is None else key_mask.astype(bool)
    if kernel == "reference":
        return ref(q, k, v, mask)
    where = target_platform()
    name = attention_kernel(where, algorithm=algorithm, dtype=q.dtype, head_dim=q.shape[-1],
                            causal=causal, window=window)
    branches = {}
    if name == "cpu":
        from sptlib.kernels.platform.cpu import attention as cpu_attention  # deferred: CPU only
        branches["cpu"] = functools.partial(cpu_attention.attention, causal=causal,
                                            window=window)
    elif name in ("cudnn", "pallas"):
        from sptlib.kernels.platform import gpu  # deferred: GPU only
        branches["cuda"] = gpu.kernel_for(q, causal=causal, window=window)
    elif name == "splash":
        from sptlib.kernels.platform import tpu  # deferred: TPU only (imports Pallas)
        branches["tpu"] = tpu.kernel_for(q, causal=causal, window=window, spec=spec)
    return on_platforms(ref, q, k, v, mask, **branches)


# ----------------------------------------------------------------------------------------------
# Step options: how a platform runs the train / eval steps (decided once, in train.resolve).
# ----------------------------------------------------------------------------------------------

def init_compiler_options(platform):
    """`jax.jit` compiler options of the one-off state-init program on `platform` (None: the
    defaults). The init program runs once; on CPU, XLA's backend optimisations of its many RNG
    calls cost seconds (4.7 s -> 1.0 s for a 1-layer model), so they are skipped there."""
    return {"xla_backend_optimization_level": 0} if platform == "cpu" else None


def sync_each_step(platform, device_count):
    """Whether the loop waits for each step's result before dispatching the next: XLA:CPU with
    several (e.g. fake) devices can deadlock in collectives when executions overlap under async
    dispatch on few cores (and a CPU has nothing to overlap with); accelerators keep
    asynchronous dispatch."""
    return platform == "cpu" and device_count > 1
