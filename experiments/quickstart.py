r"""Quickstart: does self-pretraining change a Transformer's verdict against S4D? (17 min, loaded)

    python -m sptlib.compare --config=experiments/quickstart.py --workdir=runs/quickstart

Task: generated Lines gratings (`sptlib.data.orientation`, style `gratings`), 8 x 8 grey images read as
L = 64 sequences of continuous intensities, noise 0.25; the label is the direction the stripes
run in (4 balanced classes), and every direction has the same intensity histogram, so only
relations between neighbouring pixels carry it. 8,000 training images, 1,000 validation and
1,000 test images from a stream no training image uses; generated in memory, no files.

Transformer (sinusoidal positions) and S4D, 2 layers, d = 64, PyTorch's initialisation of the
dense projections (`config.model.init_scheme = "torch"`, the scheme of the paper's PyTorch code;
docs/reproducing.md says why it matters for SPT) x scratch (STEPS), scratch-equal-compute
(PRETRAIN_STEPS + STEPS) and masked SPT (50% of the pixels, L1 on the normalised intensities as
for LRA Image, PRETRAIN_STEPS, then STEPS of finetuning with a fresh head) x 3 seeds = 18 runs,
batch 32, AdamW lr 2e-3 cosine, weight decay 0.01 (SSM parameters lr 1e-3, no decay). The grid
runs as one process per core (`config.compare.jobs = 0`, see `sptlib.protocol.compare_jobs`). The
measured table, its wall time and what it shows are in the README and docs/reproducing.md.

Add the bag-of-words control with `--models=transformer,s4d,bow` (it cannot beat chance here:
all four classes share one intensity histogram). `experiments/reproduce_local.py` is the
longer local reproduction.

    get_config("[model,regime][,steps=<finetune steps>][,pretrain_steps=..][,init=torch|linen]")
"""

from sptlib.configs import common, cpu_sized

POSITIONAL = ("model", "regime")

# Chosen from pilots on the 2-core machine (docs/reproducing.md): at 600 denoising steps the
# Transformer's masked loss has left the marginal (400 was not enough: SPT 70.5%).
STEPS = 200
PRETRAIN_STEPS = 600
BATCH = 32


def get_config(arg=""):
    a = common.parse_arg(arg, POSITIONAL)
    c = cpu_sized.lines(
        a.get("model", "s4d"), a.get("regime", "spt-masked"), resolution=8, num_train=8000,
        num_eval=1000, n_layers=2, d_model=64, steps=int(a.get("steps", STEPS)),
        pretrain_steps=int(a.get("pretrain_steps", PRETRAIN_STEPS)), batch_size=BATCH, lr=2e-3,
        eval_every=100, target="l1", noise=0.25, style="gratings",
        init_scheme=a.get("init", "torch"),
        compare=dict(models=("transformer", "s4d"),
                     regimes=("scratch", "scratch-equal-compute", "spt-masked"),
                     seeds=(0, 1, 2),
                     title="Quickstart: Lines gratings 8x8 (L=64), scratch vs masked SPT"))
    with c.unlocked():
        c.compare.jobs = 0  # one process per core
    return c
