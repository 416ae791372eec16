"""Logging set-up shared by the command-line entry points (`sptlib.main`, `sptlib.protocol.compare`)."""

import glob
import importlib.metadata
import importlib.util
import logging as pylogging
import os
import pathlib

_GOOGLE_PCI_VENDOR = "0x1ae0"  # TPU chips are PCI devices of this vendor


class _LibraryInfoFilter(pylogging.Filter):
    """Drops INFO/DEBUG records of chatty libraries (orbax logs every file of every save)."""

    _QUIET = ("/orbax/", "/grain/")

    def filter(self, record):
        if str(record.msg).startswith("Requested `tracked_metric`"):
            return False  # orbax, on every checkpoint saved between evaluations: expected here
        if str(record.msg).startswith("Metadata file does not exist") and \
                "/orbax/" in record.pathname:
            return False  # orbax, on the partial (backbone-only) restore of init_from: expected
        return record.levelno >= pylogging.WARNING or not any(
            q in record.pathname for q in self._QUIET)


def quiet_library_logs():
    """Keeps library chatter that is not about the user's run out of the log; warnings still show.

    - orbax's and grain's INFO records (every file of every checkpoint save);
    - jax's "Unable to initialize backend 'tpu'" (INFO, on every CPU-only start);
    - libtpu's start-up lines on a machine without TPUs (`cpu_only_without_tpu`);
    - TensorFlow's C++ start-up lines (oneDNN notice and absl's "All log messages before
      absl::InitializeLog()"): TF is imported later (TFDS, the tfds extra), so setting its
      environment here is early enough; grain's spawned workers inherit it. TF only reads datasets for
      us, so its oneDNN kernels are not needed.
    """
    pylogging.getLogger("absl").addFilter(_LibraryInfoFilter())
    pylogging.getLogger("jax._src.xla_bridge").setLevel(pylogging.WARNING)
    cpu_only_without_tpu()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def _tpu_chip_present() -> bool:
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            if pathlib.Path(vendor).read_text().strip() == _GOOGLE_PCI_VENDOR:
                return True
        except OSError:
            continue
    return False


def _other_jax_plugins() -> bool:
    """True when a JAX backend plugin besides libtpu (CUDA, ROCm, ...) is installed."""
    if importlib.metadata.entry_points(group="jax_plugins"):
        return True
    return importlib.util.find_spec("jax_plugins") is not None


def cpu_only_without_tpu() -> bool:
    """Keeps JAX on the CPU when libtpu is installed (the `[tpu]` and `[test]` extras, for
    `sptlib.protocol.aot`) but the machine has no TPU chip and no other accelerator plugin.

    Otherwise JAX loads and starts libtpu on every run, and libtpu sometimes writes warnings
    about TPU VM metadata (accelerator type, worker hostnames) that a CPU machine cannot have.
    An explicit `JAX_PLATFORMS` is always left alone. Must run before JAX starts a backend.
    Returns True when it restricted JAX to the CPU.
    """
    if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
        return False
    if _tpu_chip_present() or _other_jax_plugins():
        return False
    import jax  # deferred: this module is imported by the CLIs before their flags are parsed

    jax.config.update("jax_platforms", "cpu")
    return True


def define_verbose_flag():
    """`--verbose` of every command line: print the traceback of errors, not one line."""
    from absl import flags  # absl only where a command line defines its flags
    return flags.DEFINE_bool("verbose", False, "Print the traceback of errors (also: "
                             "SPTLIB_TRACEBACK=1).")
