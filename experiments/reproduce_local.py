r"""Local reproduction of the paper's effect (27 runs; not yet run to completion, see below).

    python -m sptlib.compare --config=experiments/reproduce_local.py --workdir=runs/reproduce

Generated Pathfinder at 16 x 16 (L=256, continuous pixel intensities), contour length 14 (the
LRA difficulty) — the task where LRA Transformers from scratch sit near chance for lack of
inductive bias (DESIGN.md §8). 8,000 training images; 1,000 validation and 1,000 test images
drawn from a generator seed never used for training images. Transformer, S4D and DLR (2 layers,
d=64, same optimiser and budget: AdamW lr 2e-3, cosine, SSM parameters lr 1e-3 without weight
decay) × scratch (STEPS), scratch-equal-compute (PRETRAIN_STEPS + STEPS) and masked SPT (50% of
pixels, 256-way pixel reconstruction, PRETRAIN_STEPS, then STEPS of finetuning from the best
pretrain checkpoint) × 3 seeds = 27 runs, batch 32.

What the paper predicts (issue 8's acceptance): Transformer SPT − scratch ≥ +10 points; the
S4D − Transformer gap smaller under SPT than from scratch; DLR + SPT within 2 points of S4D + SPT.
Budget: 500 + 500 steps (about two epochs of the training images per stage). NOT run to
completion: the development session (a 2-core machine shared with other jobs, load 6-13) ran
only seed 0 of the Transformer/S4D/DLR scratch and S4D spt-masked cells, and every one ended at
the test set's majority share (49.0%); the masked-pixel pretraining had barely moved below the
loss of predicting the marginal pixel distribution. Estimated cost of the full grid: ~2 h on a
quiet 2-core machine (7,500 Transformer and 15,000 SSM steps at ~3.5 steps/s, plus evaluation),
3-4 h under load. docs/reproducing.md has the numbers and what to try next.
For a longer run: `--config=experiments/reproduce_local.py:steps=2000,pretrain_steps=2000`.

    get_config("[model,regime][,steps=..][,pretrain_steps=..][,resolution=16]"
               "[,contour_length=14 (6 | 9 | 14)]")
"""

from sptlib import experiments_lib as lib

POSITIONAL = ("model", "regime")
STEPS = 500
PRETRAIN_STEPS = 500
CONTOUR_LENGTH = 14


def get_config(arg=""):
    a = lib.parse_arg(arg, POSITIONAL)
    resolution = int(a.get("resolution", 16))
    contour = int(a.get("contour_length", CONTOUR_LENGTH))
    return lib.local_pathfinder(
        a.get("model", "s4d"), a.get("regime", "spt-masked"), resolution=resolution,
        contour_length=contour, num_train=8000, num_eval=1000, n_layers=2, d_model=64,
        steps=int(a.get("steps", STEPS)), pretrain_steps=int(a.get("pretrain_steps",
                                                                    PRETRAIN_STEPS)),
        batch_size=32, lr=2e-3, eval_every=100,
        compare=dict(models=("transformer", "s4d", "dlr"),
                     regimes=("scratch", "scratch-equal-compute", "spt-masked"),
                     seeds=(0, 1, 2),
                     title=f"Local reproduction: Pathfinder {resolution}x{resolution}, "
                     f"contour length {contour}"))
