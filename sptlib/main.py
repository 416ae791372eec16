"""Command line entry point: flags only, then `sptlib.pipeline.run(config, workdir)`.

    python -m sptlib.main --config=experiments/smoke.py --workdir=/tmp/smoke \
        [--config.stages.pretrain.num_steps=100]

Also installed as the `spt-train` console script. Re-running the same command resumes.
"""

import sys

from absl import app
from absl import flags
from absl import logging

from sptlib import logs
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file (experiments/X.py[:arg]); override fields with "
    "--config.a.b=value.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output folder (local path or gs://...); each "
                               "stage writes to workdir/<stage>/.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    logs.quiet_library_logs()
    # Imported here so that `--help` and flag errors stay fast (JAX, TF, orbax are heavy).
    from sptlib import pipeline
    from sptlib.train import loop
    try:
        pipeline.run(_CONFIG.value, _WORKDIR.value)
    except loop.PreemptedError as e:
        logging.warning("%s", e)
        sys.exit(3)
    except loop.NonFiniteLossError as e:
        logging.error("%s", e)
        sys.exit(2)


def run():
    """Console-script entry point (`spt-train`)."""
    app.run(main)


if __name__ == "__main__":
    run()
