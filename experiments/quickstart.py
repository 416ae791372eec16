r"""Quickstart: does self-pretraining change the Transformer-vs-S4D verdict on a long-range task?

    python -m sptlib.compare --config=experiments/quickstart.py --workdir=runs/quickstart

Generated Pathfinder (is there a path between the two markers?) at 16 x 16 pixels read as a
256-step sequence of pixel intensities, contour length 9 — built by the package on first use
(`config.data.generate`): 8,000 training images, then 1,000 validation and 1,000 test images drawn
from a generator seed never used for a training image (`sptlib.data.pathfinder.generate`,
`held_out_from`). Transformer (2 layers, d=64, 4 heads) and S4D (2 layers, d=64) × scratch vs
masked SPT (50% of the pixels, 256-way pixel reconstruction) → finetune with the same budget as
scratch, 2 seeds: 12 training stages. Measured on an idle 2-core machine: 23.3 min for the
README's command from a clean clone (install 1.2 min, data ~1 min, the 8 runs 20.9 min); see
docs/reproducing.md. The table lands in `runs/quickstart/comparison.md`, plots beside it.

This is a demonstration of the protocol, not of the paper's effect size: the budget is minutes.
`experiments/reproduce_local.py` is the run sized to show the effect.

    get_config("[model,regime][,steps=<finetune steps>][,resolution=16]")
"""

from sptlib import experiments_lib as lib
from sptlib import experiments_local as local

POSITIONAL = ("model", "regime")

# Measured on the 2-core development machine: see docs/reproducing.md.
STEPS = 300
PRETRAIN_STEPS = 300
BATCH = 32


def get_config(arg=""):
    a = lib.parse_arg(arg, POSITIONAL)
    model = a.get("model", "s4d")
    regime = a.get("regime", "spt-masked")
    steps = int(a.get("steps", STEPS))
    pretrain_steps = int(a.get("pretrain_steps", PRETRAIN_STEPS))
    resolution = int(a.get("resolution", 16))
    return local.local_pathfinder(
        model, regime, resolution=resolution, contour_length=9, num_train=8000,
        num_eval=1000, n_layers=2, d_model=64, steps=steps, pretrain_steps=pretrain_steps,
        batch_size=BATCH, lr=2e-3, eval_every=100,
        compare=dict(models=("transformer", "s4d", "bow"), regimes=("scratch", "spt-masked"),
                     seeds=(0, 1), title=f"Quickstart: Pathfinder {resolution}x{resolution} "
                     f"(L={resolution * resolution}), scratch vs masked SPT"))
