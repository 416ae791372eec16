r"""Learning-curve study: where does a scratch Transformer fall behind an SSM, and does SPT close it?

    python -m sptlib.compare --config=experiments/study.py --workdir=runs/study256
    python -m sptlib.compare --config=experiments/study.py:length=1024 --workdir=runs/study1024

Task: generated Lines gratings (`sptlib.data.orientation`, style `gratings`), sqrt(L) x sqrt(L) grey
images read as L = 64, 256 or 1,024 sequences of continuous intensities, noise 0.25; the label
is the direction the stripes run in (4 balanced classes). Every direction has the same intensity
histogram, so only relations between a pixel and its neighbours (sequence offsets 1 and
sqrt(L) +- 1) carry the label. 8,000 generated training images, of which the grid uses the
nested subsets `config.compare.data_fractions` (default 1/16 = 500 images, and all 8,000);
1,000 validation and 1,000 test images from a stream no training image uses.

Transformer (sinusoidal positions), S4D and DLR, 2 layers, d = 64, PyTorch's initialisation of
the dense projections (`init=torch`), one optimiser (AdamW lr 2e-3, warmup + cosine, weight
decay 0.01; SSM parameters lr 1e-3 without decay), batch 32 x scratch (STEPS), scratch with the
same total steps (PRETRAIN_STEPS + STEPS, `scratch-equal-compute`) and masked SPT (50% of the
pixels, 256-way pixel targets, PRETRAIN_STEPS on the same training subset, then STEPS of
finetuning with a fresh head). At L = 256 and all 8,000 images this is the setting of the
PyTorch-peer fidelity check in docs/reproducing.md.

Evaluation every 100 steps gives the learning curves: the equal-compute run is the scratch
accuracy-vs-steps curve, the pretraining stage's validation loss the denoising curve. The
comparison's report appends the learning-curve sections to `comparison.md` (steps to the
denoising plateau, accuracy at fixed step counts, accuracy against training-set size) and
writes `denoising.png`. Measured results: docs/reproducing.md, "Learning-curve study".

    get_config("[model,regime][,length=64|256|1024][,steps=..][,pretrain_steps=..]"
               "[,train=8000][,init=torch|linen][,target=pixel256|l1]")
"""

import math

from sptlib.configs import common, cpu_sized

POSITIONAL = ("model", "regime")
STEPS = 600
PRETRAIN_STEPS = 2000
TRAIN = 8000
VAL = 1000
FRACTIONS = (0.0625, 1.0)  # 500 and 8,000 training images


def get_config(arg=""):
    a = common.parse_arg(arg, POSITIONAL)
    length = int(a.get("length", 256))
    resolution = math.isqrt(length)
    if resolution * resolution != length:
        raise ValueError(f"experiments/study.py: length={length} must be a square (64, 256, "
                         "1024): the task is an image read row by row")
    return cpu_sized.lines(
        a.get("model", "s4d"), a.get("regime", "spt-masked"), resolution=resolution,
        num_train=int(a.get("train", TRAIN)), num_eval=VAL, n_layers=2, d_model=64,
        steps=int(a.get("steps", STEPS)),
        pretrain_steps=int(a.get("pretrain_steps", PRETRAIN_STEPS)), batch_size=32, lr=2e-3,
        eval_every=100, target=a.get("target", "pixel256"), noise=0.25, style="gratings",
        init_scheme=a.get("init", "torch"),
        compare=dict(models=("transformer", "s4d", "dlr"),
                     regimes=("scratch", "scratch-equal-compute", "spt-masked"),
                     seeds=(0, 1, 2), data_fractions=FRACTIONS,
                     title=f"Learning-curve study: Lines gratings {resolution}x{resolution} "
                     f"(L={length})"))
