r"""Local reproduction of the paper's effect (≤ 3 hours on 2 CPU cores, target; not yet measured).

    python -m sptlib.compare --config=experiments/reproduce_local.py --workdir=runs/reproduce

Generated Pathfinder at 16 x 16 (L=256), contour length 14 (the LRA difficulty) — the task where
LRA Transformers from scratch sit near chance for lack of inductive bias (DESIGN.md §8).
Transformer, S4D and DLR (2 layers, d=64, same optimiser and budget) × scratch,
scratch-equal-compute (pretrain + finetune steps) and masked SPT (50% pixels, 256-way
reconstruction) × 3 seeds = 27 runs. What the paper predicts (issue 8's acceptance):
Transformer SPT − scratch ≥ +10 points; the S4D − Transformer gap smaller under SPT than from
scratch; DLR + SPT within 2 points of S4D + SPT. The measured table goes to
docs/reproducing.md, whether or not it shows this.

Step budget sized from measured step times on the shared 2-core machine (Transformer, 2×64,
L=256, batch 32: ~1.2 s/step under 3-4x contention, ~0.35 s/step estimated idle):
45 × STEPS stage-steps at ~0.25 s average ≈ 2.5 h at STEPS=800.

    get_config("[model,regime][,steps=..][,pretrain_steps=..][,resolution=16]")
"""

from sptlib import experiments_lib as lib

POSITIONAL = ("model", "regime")
STEPS = 800
PRETRAIN_STEPS = 800


def get_config(arg=""):
    a = lib.parse_arg(arg, POSITIONAL)
    resolution = int(a.get("resolution", 16))
    return lib.local_pathfinder(
        a.get("model", "s4d"), a.get("regime", "spt-masked"), resolution=resolution,
        contour_length=14, num_train=8000, num_eval=1000, n_layers=2, d_model=64,
        steps=int(a.get("steps", STEPS)), pretrain_steps=int(a.get("pretrain_steps",
                                                                    PRETRAIN_STEPS)),
        batch_size=32, lr=2e-3, eval_every=100,
        compare=dict(models=("transformer", "s4d", "dlr"),
                     regimes=("scratch", "scratch-equal-compute", "spt-masked"),
                     seeds=(0, 1, 2),
                     title=f"Local reproduction: Pathfinder {resolution}x{resolution}, "
                     "contour length 14"))
