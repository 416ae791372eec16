r"""Long-range local reproduction of the paper's effect on generated Lines gratings (L = 256, CPU).

    python -m sptlib.compare --config=experiments/reproduce_local.py --workdir=runs/reproduce

The grid runs as one process per core (`config.compare.jobs = 0`, see `sptlib.protocol.compare_jobs`).

Task (`sptlib.data.orientation`, style `gratings`): 16 x 16 grey images read as L = 256 pixel
sequences, each a noisy sinusoidal grating (period 3-6 px, random phase and contrast, noise
0.25); the label is the direction the stripes run in (horizontal, vertical, diagonal,
anti-diagonal; 4 balanced classes). Every direction has the same intensity histogram, so only
relations between a pixel and its neighbours at sequence offsets 1, 15, 16, 17 carry the label.
8,000 images are generated, of which the runs train on the nested subset FRACTION (1/16 = 500
images: `config.data.data_fraction`, the same subset for every stage); validation and test
(VAL each) come from a stream no training image uses. Generated in memory at start-up, no files.

Transformer (sinusoidal positions), S4D and DLR (2 layers, d = 64, PyTorch's initialisation of
the dense projections, `init=torch`; one optimiser for all: AdamW lr 2e-3, warmup + cosine,
weight decay 0.01; SSM parameters lr 1e-3 without weight decay) x scratch (STEPS),
scratch-equal-compute (PRETRAIN_STEPS + STEPS) and masked SPT (50% of the pixels, 256-way pixel
targets, PRETRAIN_STEPS on the same 500 images, then STEPS of finetuning with a fresh head) x 3
seeds = 27 runs, batch 32. These are the 1/16 cells of the learning-curve study
(`experiments/study.py`), which chose this setting; docs/reproducing.md has both.

What the paper predicts (issue 13's acceptance): Transformer SPT − scratch ≥ +10 points; the
S4D − Transformer gap smaller under SPT than from scratch; DLR + SPT within 2 points of S4D +
SPT; the equal-compute column reported.

`setting=l64` is the earlier 8 x 8 (L = 64) reproduction: all 8,000 images, L1 targets on the
normalised intensities, Flax's default initialisation, 2,000 + 300 steps.

    get_config("[model,regime][,setting=l256|l64][,steps=..][,pretrain_steps=..]"
               "[,resolution=..][,fraction=..][,style=gratings|segments]"
               "[,target=l1|pixel256][,noise=0.25][,lr=2e-3][,input=continuous|tokens]"
               "[,init=linen|torch]")

`init=torch` draws the dense projections as PyTorch's nn.Linear / nn.TransformerEncoderLayer do
(`config.model.init_scheme`); see docs/reproducing.md, "SPT fidelity vs a PyTorch peer".
"""

from sptlib.configs import common, cpu_sized

POSITIONAL = ("model", "regime")
TRAIN = 8000
VAL = 1000
# setting -> defaults (each can be overridden by its own argument).
SETTINGS = {
    "l256": dict(resolution=16, fraction=0.0625, steps=600, pretrain_steps=2000,
                 target="pixel256", init="torch"),
    "l64": dict(resolution=8, fraction=1.0, steps=300, pretrain_steps=2000, target="l1",
                init="linen"),
}


def get_config(arg=""):
    a = common.parse_arg(arg, POSITIONAL)
    setting = a.get("setting", "l256")
    if setting not in SETTINGS:
        raise ValueError(f"experiments/reproduce_local.py: setting={setting!r}; known: "
                         f"{', '.join(SETTINGS)}")
    d = {**SETTINGS[setting], **{k: v for k, v in a.items() if k in SETTINGS[setting]}}
    resolution, fraction = int(d["resolution"]), float(d["fraction"])
    c = cpu_sized.lines(
        a.get("model", "s4d"), a.get("regime", "spt-masked"), resolution=resolution,
        num_train=TRAIN, num_eval=VAL, n_layers=2, d_model=64, steps=int(d["steps"]),
        pretrain_steps=int(d["pretrain_steps"]), batch_size=32, lr=float(a.get("lr", 2e-3)),
        eval_every=100, target=d["target"], noise=float(a.get("noise", 0.25)),
        input_type=a.get("input", "continuous"), style=a.get("style", "gratings"),
        init_scheme=d["init"],
        compare=dict(models=("transformer", "s4d", "dlr"),
                     regimes=("scratch", "scratch-equal-compute", "spt-masked"),
                     seeds=(0, 1, 2), data_fractions=(fraction,),
                     title=f"Local reproduction: Lines/{a.get('style', 'gratings')} "
                     f"{resolution}x{resolution} (L={resolution * resolution}), "
                     f"{round(fraction * TRAIN)} training images"))
    with c.unlocked():
        c.data.data_fraction = fraction  # `sptlib.main` runs train on the same subset
        c.compare.jobs = 0  # one process per core
    return c
