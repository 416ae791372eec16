"""The flags of `python -m sptlib.aot` (`sptlib.protocol.aot`), apart so that `--help` and flag
errors parse without importing JAX."""

from absl import flags

from sptlib.configs import common

# XLA's execution-time optimisation effort for these compiles (-1..1; 0 is what the pod's own
# compile uses). At -1 libtpu skips most of its search for fast code, which is what makes long
# FFT convolutions slow to compile on a CPU host (one [4, 16384, 256] convolution's forward and
# backward: 16 s instead of ~190 s). It fuses less, so at paper sizes it plans *more* memory
# than effort 0 (ListOps Transformer pretrain 23.1 vs 18.1 GiB per chip; docs/reproducing.md):
# a fit it reports holds on the pod, and `--effort=0` gives the pod's own plan.
FAST_EFFORT = -1.0


def define_flags():
    """Defines the CLI's flags. Called by the entry point only: `sptlib.main` and
    `sptlib.protocol.compare` define `--config` too, and one process (a test worker) may import all
    three modules."""
    common.define_config_flag(
        "config", "Experiment config (experiments/X.py[:arg], packaged; or your own "
        "path.py[:arg]); override fields with --config.a.b=value.", lock_config=True)
    flags.DEFINE_string("topology", "", "TPU slice, e.g. v4-32, v5e-16, v5p-8; "
                        "default: the config's aot.slice.")
    flags.DEFINE_string("stage", "", "Compile only this stage (default: every stage).")
    flags.DEFINE_bool("all", False, "Every paper config: each LRA task (PathX-256 "
                      "included), sCIFAR and Speech Commands x Transformer and S4, each stage.")
    flags.DEFINE_string("match", "", "With --all: only configs whose name (e.g. "
                        "'lra.py:pathx,s4,spt-masked') matches this regular expression.")
    flags.DEFINE_string("json", "", "Write the per-stage records to this JSON file.")
    flags.DEFINE_bool("markdown", False, "Print a Markdown table (docs/benchmarks.md).")
    flags.DEFINE_float("mfu", 0.4, "Stated model FLOP utilisation for the chip-hours.")
    flags.DEFINE_enum("estimate", "unrolled", ["unrolled", "scanned"],
                      "Step time for the bound: from the train step compiled again with its "
                      "layers unrolled (unbiased), or from the scanned step as trained (one "
                      "compile; libtpu costs the scanned layer body once).")
    flags.DEFINE_integer("jobs", 0, "Stages compiled at once (threads); 0: one per core of "
                         "this process's CPU set.")
    flags.DEFINE_float("effort", FAST_EFFORT, "XLA's execution-time optimisation effort for "
                       "these compiles, -1..1 (jax_exec_time_optimization_effort; a pod's own "
                       "compile uses 0). -1 compiles long convolutions ~10x faster here and "
                       "plans more memory than 0 at paper sizes, so its fits are conservative "
                       "(docs/reproducing.md).")
