"""The flags of `python -m sptlib.compare` (`sptlib.protocol.compare`), apart so that `--help`
and flag errors parse without importing the protocol (JAX, TensorFlow: seconds)."""

from absl import flags

from sptlib import logs
from sptlib.configs import common

_CONFIG = common.define_config_flag(
    "config", "Experiment config file with a `compare` section: experiments/X.py[:arg] (the "
    "packaged experiments, from any folder) or path/to/your_config.py[:arg].", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory of the whole comparison.")
# Comma-separated overrides of config.compare.<name>: name -> the help after "Override ...".
_LIST_OVERRIDES = {
    "models": ".",
    "regimes": ".",
    "seeds": " (integers).",
    "data_fractions": " (nested training subsets).",
    "lrs": ": train every cell at each learning rate and report each (model, regime) at the one "
           "chosen on validation (sptlib.protocol.sweeps).",
    "lr_seeds": ": only these seeds sweep --lrs; the others run once, at the lr their sweep "
                "chose on validation.",
    "length_factors": ": evaluate the finished classifier on test inputs this many times longer "
                      "(e.g. 2,4), for tasks and models that allow.",
}
_OVERRIDE = {name: flags.DEFINE_list(name, None, f"Override config.compare.{name}{more}")
             for name, more in _LIST_OVERRIDES.items()}
_RAND_INIT = flags.DEFINE_bool(
    "rand_init", False, "Also run every SSM model with random (unstructured) state-space init "
    "(model name + '-randinit'), the paper's structured-vs-random ablation.")
_REPORT_ONLY = flags.DEFINE_bool(
    "report_only", False, "Only rebuild comparison.json/md and plots from finished runs.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the runs and exit.")
_JOBS = flags.DEFINE_integer("jobs", None, "Processes to run the grid in (each --shard=i/n, "
                             "pinned to its cores), then the table; 0 = one per core. Default: "
                             "config.compare.jobs, else 1. See sptlib.protocol.compare_jobs.")
_VERBOSE = logs.define_verbose_flag()
_SHARD = flags.DEFINE_string(
    "shard", None, "i/n: run only shard i of n (0-based; even in training steps, the lrs of an "
    "SPT cell together), so n processes (e.g. one per core, or one per machine sharing the "
    "workdir) split the grid. Each writes "
    "comparison.shard<i>of<n>.json; rerun without --shard (or with --report_only) for the table.")
_SHARD_DEFERRED = flags.DEFINE_bool(
    "shard_deferred", False, "With --shard: split only the seeds whose lr a finished sweep chose "
    "(config.compare.lr_seeds; --jobs's second round).")
