"""Build and registration of the C++ XLA:CPU kernels (`*.cc` beside this file).

Four kernels live there, each the CPU implementation of a jnp function with the same semantics
(`sptlib.kernels.platform` chooses between them): softmax attention without the score matrix
in memory (`attention.py`), the SSMs' long convolution on a multi-threaded FFT (`conv.py`),
S4's Cauchy sums and Woodbury step (`s4.py`) and small dense layers' weight gradient xᵀ g
(`linear.py`).

The sources are compiled together into one shared library with the host's C++ compiler (`$CXX`,
else `g++`/`c++`/`clang++`, `-O3 -march=native`) into a cache directory (`$SPTLIB_KERNEL_CACHE`,
else `~/.cache/sptlib/kernels`) keyed by the sources, the jaxlib version, the compiler's path and
version, the flags and the CPU's model and instruction-set flags (`-march=native` code is only
valid on CPUs with those instructions, and a cache may be shared by a mixed cluster), and
registered as XLA FFI targets for the CPU platform. A library is loaded only when it is
verified: a regular file of this user in a folder of this user that nobody else can write to,
whose SHA-256 equals the one recorded beside it (`<lib>.sha256`) when this code built it. A
cache folder of another owner or writable by group/others is not used (the private default is,
with one warning); a library that fails the check is built again, never loaded. Where no compiler works, the jnp functions run
instead (a warning says why, once). `SPTLIB_NATIVE=0` turns the kernels off.
"""

import ctypes
import glob
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading

import jax

_DIR = os.path.dirname(os.path.abspath(__file__))
_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")
# FFI target name -> exported handler symbol.
TARGETS = {
    "sptlib_fused_attention_fwd": "SptlibFusedAttentionFwd",
    "sptlib_fused_attention_bwd": "SptlibFusedAttentionBwd",
    "sptlib_fft_conv_fwd": "SptlibFftConvFwd",
    "sptlib_fft_conv_bwd": "SptlibFftConvBwd",
    "sptlib_weight_grad": "SptlibWeightGrad",
    "sptlib_s4_spectrum_fwd": "SptlibS4SpectrumFwd",
    "sptlib_s4_spectrum_bwd": "SptlibS4SpectrumBwd",
}
_lock = threading.Lock()
_state = {}  # "ok": bool, "why": str (set once)
_warned = set()  # unsafe cache folders already warned about


def _compiler():
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cache_dir():
    return os.environ.get("SPTLIB_KERNEL_CACHE") or _default_cache()


def _default_cache():
    return os.path.join(os.path.expanduser("~"), ".cache", "sptlib", "kernels")


def _unsafe(folder) -> str:
    """Why `folder` cannot hold libraries this process loads ('' when it can): another owner,
    or writable by group/others (anyone who can write there can replace a library)."""
    try:
        st = os.stat(folder)
    except FileNotFoundError:
        return ""
    except OSError as e:
        return e.strerror or str(e)
    if not stat.S_ISDIR(st.st_mode):
        return "not a folder"
    if st.st_uid != os.geteuid():
        return f"it belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def _safe_cache_dir():
    """The cache folder to use: `_cache_dir()` when it is safe, else the private default
    (one warning); raises RuntimeError when neither is."""
    folder = _cache_dir()
    why = _unsafe(folder)
    if not why:
        return folder
    private = _default_cache()
    if folder != private and not _unsafe(private):
        if folder in _warned:
            return private
        _warned.add(folder)
        logging.warning("sptlib: not using the native-kernel cache %s (%s): building into "
                        "%s instead.", folder, why, private)
        return private
    raise RuntimeError(f"the native-kernel cache {folder} is unsafe ({why}); set "
                       f"SPTLIB_KERNEL_CACHE to a folder only you can write")


def _sha256(f) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


def _open_verified(lib):
    """An open file of `lib` when it is a regular file of this user, not writable by others,
    whose SHA-256 is the one recorded beside it at build time (`<lib>.sha256`); else None and
    why. The library is then loaded through this open file, so what was checked is what runs."""
    try:
        fd = os.open(lib, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None, "not built yet"
    except OSError as e:
        return None, f"cannot open it ({e.strerror or e}; a symlink?)"
    f = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    why = ("not a regular file" if not stat.S_ISREG(st.st_mode) else
           f"it belongs to uid {st.st_uid}" if st.st_uid != os.geteuid() else
           "it is writable by group or others" if st.st_mode & 0o022 else "")
    if not why:
        try:
            with open(lib + ".sha256", "rb", opener=_nofollow) as g:
                recorded = g.read(200).decode("ascii", "replace").strip()
        except OSError:
            recorded = None
        actual = _sha256(f)
        why = ("no build-time digest beside it" if recorded is None else
               "its SHA-256 differs from the one recorded when it was built"
               if recorded != actual else "")
    if why:
        f.close()
        return None, why
    f.seek(0)
    return f, ""


def _nofollow(path, flags):
    return os.open(path, flags | os.O_NOFOLLOW)


def _load(f, lib):
    """ctypes handle of the verified open file `f` (via /proc/self/fd where there is one)."""
    proc = f"/proc/self/fd/{f.fileno()}"
    try:
        return ctypes.cdll.LoadLibrary(proc if os.path.exists(proc) else lib)
    finally:
        f.close()


def _cpu_signature():
    """The CPU's model name and instruction-set flags (`/proc/cpuinfo`), or '' where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return ""
    keys = ("model name", "flags", "Features", "CPU implementer", "CPU part")
    seen = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in keys and key not in seen:
            seen[key] = " ".join(sorted(value.split())) if key in ("flags", "Features") \
                else value.strip()
    return repr(sorted(seen.items()))


def _compiler_version(cxx):
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0] if out.stdout else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def library_path():
    """(compiler, sources, the cache path of the library they build); raises RuntimeError."""
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found ($CXX, g++, c++ or clang++)")
    sources = sorted(glob.glob(os.path.join(_DIR, "*.cc")))
    headers = sorted(glob.glob(os.path.join(_DIR, "*.h")))
    digest = hashlib.sha256()
    for path in sources + headers:
        with open(path, "rb") as f:
            digest.update(f.read())
    import jaxlib
    digest.update(repr((jaxlib.__version__, cxx, _compiler_version(cxx), _FLAGS,
                        _cpu_signature())).encode())
    out_dir = _safe_cache_dir()
    return cxx, sources, os.path.join(out_dir, f"sptlib_kernels-{digest.hexdigest()[:16]}.so")


def build():
    """Path of the compiled, verified library (compiling it if needed); raises RuntimeError."""
    cxx, sources, lib = library_path()
    out_dir = os.path.dirname(lib)
    f, why = _open_verified(lib)
    if f is not None:
        f.close()
        return lib
    if why != "not built yet":
        logging.warning("sptlib: not loading %s (%s): building it again.", lib, why)
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    why = _unsafe(out_dir)  # e.g. created by someone else between the check and here
    if why:
        raise RuntimeError(f"the native-kernel cache {out_dir} is unsafe ({why})")
    # Compile to a private name and rename: concurrent processes (pytest -n, compare's jobs)
    # never load a half-written library. The digest is recorded before the library appears.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = [cxx, *_FLAGS, "-I", jax.ffi.include_dir(), *sources, "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n"
                               f"{proc.stderr[-2000:]}")
        os.chmod(tmp, 0o700)
        with open(tmp, "rb") as g:
            sha = _sha256(g)
        sfd, side = tempfile.mkstemp(suffix=".sha256", dir=out_dir)  # 0600, a fresh name
        with os.fdopen(sfd, "wb") as g:
            g.write(sha.encode() + b"\n")
        os.replace(side, lib + ".sha256")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return lib


def available():
    """True once the kernels are compiled, loaded and registered for the CPU platform."""
    with _lock:
        if "ok" not in _state:
            try:
                if os.environ.get("SPTLIB_NATIVE", "1") == "0":
                    raise RuntimeError("turned off by SPTLIB_NATIVE=0")
                path = build()
                f, why = _open_verified(path)
                if f is None:
                    raise RuntimeError(f"{path} failed verification ({why}): not loaded")
                lib = _load(f, path)
                for target, symbol in TARGETS.items():
                    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)),
                                                platform="cpu")
                _state.update(ok=True, why="")
            except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as e:
                _state.update(ok=False, why=str(e))
                logging.warning("sptlib native CPU kernels unavailable, using the jnp versions "
                                "(same functions, slower on CPU): %s", e)
        return _state["ok"]


def unavailable_reason():
    """Why `available()` is False ('' when it is True)."""
    available()
    return _state["why"]


def partitioned(kernel, arg_dims, out_dims, replicated, n_static, summed=None):
    """`kernel` (per-device FFI calls) as a `custom_partitioning` op that runs per shard.

    `arg_dims` / `out_dims`: one tuple of factor names per operand / result (einsum-like, e.g.
    `("b", "l", "h", "d")`); factors in `replicated` are gathered, every other factor keeps the
    mesh axis it has on the first operand. `kernel(*arrays, *static)` takes `n_static` trailing
    static (hashable) arguments. `summed` (`{result index: factor}`): results that are sums over
    a factor absent from them (e.g. a weight gradient over the batch); each shard's partial sum is
    `psum`-ed over that factor's mesh axis. Without this the partitioner would replicate the custom call,
    i.e. every device would compute the whole batch.
    """
    def specs(arg0, dims_list):
        spec = tuple(getattr(arg0.sharding, "spec", ()))
        spec = spec + (None,) * (len(arg_dims[0]) - len(spec))
        axis = {f: s for f, s in zip(arg_dims[0], spec) if f not in replicated}
        return tuple(jax.sharding.PartitionSpec(*[axis.get(f) for f in dims])
                     for dims in dims_list)

    def partition(*args):
        static, (mesh, arg_shapes, _) = args[:n_static], args[n_static:]
        named = lambda ss: tuple(jax.sharding.NamedSharding(mesh, s) for s in ss)
        spec = tuple(getattr(arg_shapes[0].sharding, "spec", ()))
        axis = dict(zip(arg_dims[0], spec))
        sums = {i: axis.get(f) for i, f in (summed or {}).items() if axis.get(f) is not None}

        def lower(*a):
            out = kernel(*a, *static)
            if not sums:
                return out
            return tuple(jax.lax.psum(o, sums[i]) if i in sums else o for i, o in enumerate(out))

        return (mesh, lower, named(specs(arg_shapes[0], out_dims)),
                named(specs(arg_shapes[0], arg_dims)))

    def infer(*args):
        mesh, arg_shapes, _ = args[n_static:]
        return tuple(jax.sharding.NamedSharding(mesh, s) for s in specs(arg_shapes[0], out_dims))

    from jax.experimental.custom_partitioning import custom_partitioning
    op = custom_partitioning(kernel, static_argnums=tuple(range(len(arg_dims),
                                                                 len(arg_dims) + n_static)))
    rule = (", ".join(" ".join(d) for d in arg_dims) + " -> "
            + ", ".join(" ".join(d) for d in out_dims))
    op.def_partition(partition, infer_sharding_from_operands=infer, sharding_rule=rule,
                     need_replication_factors=tuple(replicated))
    return op
