r"""Local reproduction of the paper's effect on generated Lines gratings (27 runs, 2 CPU cores).

    python -m sptlib.compare --config=experiments/reproduce_local.py --workdir=runs/reproduce

    # the same in two processes, one per core (two 1-core shards ran ~1.4x the steps/s of one
    # 2-core process in our pilots), then the table:
    python -m sptlib.compare --config=experiments/reproduce_local.py --workdir=runs/reproduce --shard=0/2 &
    python -m sptlib.compare --config=experiments/reproduce_local.py --workdir=runs/reproduce --shard=1/2
    wait; python -m sptlib.compare --config=experiments/reproduce_local.py --workdir=runs/reproduce

Task (`sptlib.data.lines`, style `gratings`): 8 x 8 grey images read as L=64 pixel sequences,
each a noisy sinusoidal grating (period 3-6 px, random phase and contrast); the label is the
direction the stripes run in (horizontal, vertical, diagonal, anti-diagonal; 4 balanced
classes). Every direction has the same intensity histogram, so only relations between a pixel and
its neighbours at sequence offsets 1, 7, 8, 9 carry the label. TRAIN training images;
validation and test (VAL each) from a stream no training image uses; generated in memory at
start-up, no files.

Transformer (sinusoidal positions), S4D and DLR (2 layers, d=64, same optimiser and budget:
AdamW lr 2e-3, cosine, weight decay 0.01; SSM parameters lr 1e-3 without weight decay) ×
scratch (STEPS), scratch-equal-compute (PRETRAIN_STEPS + STEPS) and masked SPT (50% of pixels,
L1 reconstruction of the normalised intensities as for LRA Image, PRETRAIN_STEPS, then STEPS of
finetuning from the best pretrain checkpoint with a fresh head) × 3 seeds = 27 runs, batch 32.

What the paper predicts (issue 8's acceptance): Transformer SPT − scratch ≥ +10 points; the
S4D − Transformer gap smaller under SPT than from scratch; DLR + SPT within 2 points of S4D +
SPT. The measured table, its wall time, the machine, and the pilots that led here (16 x 16
segments and gratings, where the Transformer's denoising loss did not move within 600 steps)
are in docs/reproducing.md.

    get_config("[model,regime][,steps=..][,pretrain_steps=..][,resolution=8]"
               "[,style=gratings|segments][,target=l1|pixel256][,noise=0.25][,lr=2e-3]"
               "[,input=continuous|tokens][,init=linen|torch]")

`init=torch` draws the dense projections as PyTorch's nn.Linear / nn.TransformerEncoderLayer do
(`config.model.init_scheme`); see docs/reproducing.md, "SPT fidelity vs a PyTorch peer".
"""

from sptlib import experiments_lib as lib
from sptlib import experiments_local as local

POSITIONAL = ("model", "regime")
STEPS = 300
PRETRAIN_STEPS = 2000
TRAIN = 8000
VAL = 1000


def get_config(arg=""):
    a = lib.parse_arg(arg, POSITIONAL)
    resolution = int(a.get("resolution", 8))
    return local.local_lines(
        a.get("model", "s4d"), a.get("regime", "spt-masked"), resolution=resolution,
        num_train=TRAIN, num_eval=VAL, n_layers=2, d_model=64,
        steps=int(a.get("steps", STEPS)),
        pretrain_steps=int(a.get("pretrain_steps", PRETRAIN_STEPS)),
        batch_size=32, lr=float(a.get("lr", 2e-3)), eval_every=100,
        target=a.get("target", "l1"), noise=float(a.get("noise", 0.25)),
        input_type=a.get("input", "continuous"), style=a.get("style", "gratings"),
        init_scheme=a.get("init", "linen"),
        compare=dict(models=("transformer", "s4d", "dlr"),
                     regimes=("scratch", "scratch-equal-compute", "spt-masked"),
                     seeds=(0, 1, 2),
                     title=f"Local reproduction: Lines/{a.get('style', 'gratings')} "
                     f"{resolution}x{resolution} "
                     f"(L={resolution * resolution})"))
