r"""The SPT effect on real data, each model at the learning rate chosen on validation.

    python -m sptlib.compare --config=experiments/real.py:fmnist --workdir=runs/real_fmnist --jobs=1
    python -m sptlib.compare --config=experiments/real.py:code --workdir=runs/real_code --jobs=1
    python -m sptlib.compare --config=experiments/real.py:fmnist784 --workdir=runs/real_fmnist784
    python -m sptlib.compare --config=experiments/real.py:code_tf --workdir=runs/real_code_tf2048 --jobs=2
    python -m sptlib.compare --config=experiments/real.py:fmnist_scale --workdir=runs/real_scale --jobs=2
    python -m sptlib.compare --config=experiments/real.py:fmnist_long --workdir=runs/real_long --jobs=2
    python -m sptlib.compare --config=experiments/real.py:fmnist784_conv --workdir=runs/fmnist784_conv --jobs=2

Grids (CPU-sized; the measured tables, their wall times and what they show are in
docs/reproducing.md, "Real data"):

  fmnist        sequential Fashion-MNIST 14 x 14 (L = 196) from the Debian package
                `dataset-fashion-mnist` (54,000 training images, the last 6,000 of the training
                file for validation, the first `TEST_EXAMPLES` of the 10,000 test images),
                continuous intensities. Transformer, S4D and the bag-of-words control x
                scratch (`FMNIST_STEPS`) / equal-compute scratch (pretrain + finetune steps) /
                masked SPT (50% of the pixels, L1 on the normalised intensity,
                `FMNIST_PRETRAIN` steps, then `FMNIST_STEPS` with a fresh head) x 3 seeds, at
                the lrs `LRS`: seed 0 runs every lr, seeds 1 and 2 the lr seed 0's validation
                chose for the cell (`config.compare.lr_seeds`, `sptlib.protocol.sweeps`): 35 runs,
                74 min on the 2-core machine under other sessions' load (2026-12-04); its
                Transformer and S4D cells are a third of `fmnist_scale` (~7 min on idle cores).
  code          byte-level source-code classification (`sptlib.data.code_bytes`: which of 10
                installed packages a 2,048-byte window of Python comes from, 2,880 / 750 / 720
                windows), S4D and bow at L = 2048, masked SPT on 15% of the bytes,
                `CODE_PRETRAIN` + `CODE_STEPS` steps of batch 8, at the lrs `LRS` as `fmnist`
                (8 min on 2 idle cores); `--lrs=2e-3` runs the recipe's lr only.
  fmnist784     `fmnist` at 28 x 28 (L = 784), S4D only (15 runs; 64 min as a nice-19 process
                beside other jobs, an upper bound).
  code_tf       `code` for the Transformer at L = `CODE_TF_LENGTH` = 2048, the whole window
                (15 runs, 40 min on 2 idle cores with --jobs=2); `code_tf,length=512` reads the
                first 512 bytes of the same windows (6 min).
  fmnist_scale  `fmnist` (Transformer, S4D) on nested subsets of 1,000 / 5,000 / 54,000
                training images (`FRACTIONS`), the lr chosen per subset (90 runs; 21 min on 2
                idle cores with --jobs=2).
  fmnist_long   `fmnist_scale` on 1,000 and 54,000 images with 5x the steps (scratch 500, SPT
                1,000 + 500, equal compute 1,500: 16 to 48 passes over the 1k images), lrs
                3e-3 / 1e-2.
  fmnist784_conv
                `fmnist` at 28 x 28 (L = 784) on nested subsets of 1,000 and 10,000 training
                images (`CONV_FRACTIONS`), Transformer, S4D and bow, every stage trained to
                convergence (`sptlib.train.convergence`): validation (`CONV_EVAL_STEPS` x 256
                images) every `CONV_EVAL_EVERY` steps, stop after `CONV_PATIENCE` evaluations
                without a better accuracy (denoising: loss), caps `CONV_STEPS` (scratch,
                finetune) and `CONV_PRETRAIN` (masked denoising); equal compute trains exactly
                the steps its seed's SPT run spent (`config.compare.equal_compute = "spent"`,
                `sptlib.protocol.equal_compute`); test on the first `CONV_TEST_EXAMPLES` test
                images. 70 runs. Caps 200 / 200 with validation every 20 steps and a patience
                of 3 since 2026-12-07: the first run (2026-12-06, caps 40, validation every 10,
                patience 2; 90.3 min for the 70 runs) ended nearly every stage at its cap, and
                two 200-step pilot runs of the Transformer were still improving at 200.
                Measured 2026-12-07 with --jobs=2 on the 2-core machine, idle cores, in a
                fresh workdir: 129 min for the 70 runs (an earlier two-part run, 122 min for
                the 1,000-image half beside other work + 77 min for the rest, gave identical
                records). Most stages still end at the 200-step cap (denoising losses still
                falling). The old grid:
                `fmnist784_conv,steps=40,pretrain_steps=40,eval_every=10,patience=2`.

Every model: 2 layers, d = 64 (Transformer: 4 heads, FFN x 2, sinusoidal positions), PyTorch's
initialisation of the dense projections, AdamW with warmup and cosine decay, weight decay 0.01;
SSM parameters at half the lr and no decay. An lr of the axis sets the classification stages
(scratch, finetuning; the SSM lr scaled alike); the denoising stage runs at the recipe's 2e-3
and is trained once per seed, shared by the SPT cells of the other lrs. Validation every
`EVAL_EVERY` steps (Fashion-MNIST: the first 1,024 validation images; code: all 750) picks the
best checkpoint and, as the mean over the sweep seeds, the lr; the test accuracy reported is the
best checkpoint's. Sizes were cut to what a 2-core machine shared with five other engineers'
jobs allowed (measured below and in docs/reproducing.md).

    get_config("[grid][,model,regime][,steps=..][,pretrain_steps=..][,lrs=a/b/c][,length=..]"
               "[,eval_every=..][,patience=..]")

`steps` / `pretrain_steps` set the classification and denoising budgets (the caps of
`fmnist784_conv`), `eval_every` the validation interval and `patience` the evaluations without
improvement that stop a stage (`fmnist784_conv`; 0 = never).
"""

from sptlib.configs import common, cpu_sized
from sptlib.protocol import equal_compute

POSITIONAL = ("grid", "model", "regime")
GRIDS = ("fmnist", "fmnist784", "fmnist784_conv", "fmnist_scale", "fmnist_long", "code",
         "code_tf")
# fmnist_scale: nested training subsets of 1,000 / 5,000 / all 54,000 images (the paper's
# data-scaling experiment, config.compare.data_fractions).
FRACTIONS = (1000 / 54000, 5000 / 54000, 1.0)

REGIMES = ("scratch", "scratch-equal-compute", "spt-masked")
SEEDS = (0, 1, 2)
LRS = (1e-3, 3e-3, 1e-2)
LR_SEEDS = (0,)  # seed 0 sweeps LRS; seeds 1 and 2 run at the lr its validation chose
RECIPE_LR = 2e-3
EVAL_EVERY = 75
EVAL_STEPS = 4  # validation: 4 x 256 = 1,024 examples per evaluation (code: all 750)
TEST_EXAMPLES = 2500
# Fashion-MNIST: finetuning / scratch steps and masked-denoising steps (batch 32).
FMNIST_STEPS, FMNIST_PRETRAIN = 100, 200
# Code bytes (batch 8), at the lrs LRS like Fashion-MNIST.
CODE_STEPS, CODE_PRETRAIN = 100, 200
CODE_TF_LENGTH = 2048  # the whole window (40 min on 2 idle cores); length=512 in 6 min
# fmnist784_conv: every stage trains to convergence (sptlib.train.convergence): it stops after
# CONV_PATIENCE evaluations (every CONV_EVAL_EVERY steps, on CONV_EVAL_STEPS x 256 validation
# images) without a better validation accuracy (denoising: loss), at the latest at its cap.
CONV_FRACTIONS = (1000 / 54000, 10000 / 54000)
CONV_STEPS, CONV_PRETRAIN = 200, 200  # caps (batch 32), sized in the docstring
CONV_EVAL_EVERY, CONV_EVAL_STEPS, CONV_PATIENCE = 20, 1, 3
CONV_TEST_EXAMPLES = 500


def _grid(name, length=None):
    if name == "fmnist":
        return dict(models=("transformer", "s4d", "bow"), length=196, steps=FMNIST_STEPS,
                    pretrain=FMNIST_PRETRAIN, batch=32,
                    title="Real data: sequential Fashion-MNIST 14x14 (L=196)")
    if name == "fmnist_scale":
        return dict(models=("transformer", "s4d"), length=196, steps=FMNIST_STEPS,
                    pretrain=FMNIST_PRETRAIN, batch=32, fractions=FRACTIONS,
                    title="Real data: sequential Fashion-MNIST (L=196), 1k / 5k / 54k images")
    if name == "fmnist_long":
        return dict(models=("transformer", "s4d"), length=196, steps=5 * FMNIST_STEPS,
                    pretrain=5 * FMNIST_PRETRAIN, batch=32, fractions=FRACTIONS[::2],
                    lrs=LRS[1:], title="Real data: sequential Fashion-MNIST (L=196), 1k / 54k "
                    "images, 5x the steps")
    if name == "fmnist784_conv":
        return dict(models=("transformer", "s4d", "bow"), length=784, steps=CONV_STEPS,
                    pretrain=CONV_PRETRAIN, batch=32, fractions=CONV_FRACTIONS,
                    eval_every=CONV_EVAL_EVERY, eval_steps=CONV_EVAL_STEPS,
                    patience=CONV_PATIENCE, test_examples=CONV_TEST_EXAMPLES,
                    title="Real data: sequential Fashion-MNIST 28x28 (L=784), 1k / 10k images, "
                          "trained to convergence")
    if name == "fmnist784":
        return dict(models=("s4d",), length=784, steps=FMNIST_STEPS, pretrain=FMNIST_PRETRAIN,
                    batch=32, title="Real data: sequential Fashion-MNIST 28x28 (L=784)")
    if name in ("code", "code_tf"):
        tf = name == "code_tf"
        length = int(length or (CODE_TF_LENGTH if tf else 2048))
        return dict(models=("transformer",) if tf else ("s4d", "bow"), length=length,
                    steps=CODE_STEPS, pretrain=CODE_PRETRAIN, batch=8,
                    title=f"Real data: source-code bytes (L={length})")
    raise ValueError(f"experiments/real.py: unknown grid {name!r}; expected one of {GRIDS}")


def get_config(arg=""):
    a = common.parse_arg(arg, POSITIONAL)
    name = a.get("grid", "fmnist")
    if "length" in a and not name.startswith("code"):
        raise ValueError(f"experiments/real.py:{arg}: length= sets the code grids' L only "
                         "(Fashion-MNIST: fmnist is L 196, fmnist784 L 784)")
    g = _grid(name, a.get("length"))
    model, regime = a.get("model", g["models"][0]), a.get("regime", "spt-masked")
    steps = int(a.get("steps", g["steps"]))
    pretrain = int(a.get("pretrain_steps", g["pretrain"]))
    lrs = tuple(float(x) for x in a["lrs"].split("/")) if "lrs" in a else g.get("lrs", LRS)
    g.update({k: int(a[k]) for k in ("eval_every", "patience") if k in a})
    compare = dict(models=g["models"], regimes=REGIMES, seeds=SEEDS, title=g["title"],
                   data_fractions=g.get("fractions", (1.0,)))
    common_kw = dict(n_layers=2, d_model=64, steps=steps, pretrain_steps=pretrain,
                     batch_size=g["batch"], lr=RECIPE_LR,
                     eval_every=g.get("eval_every", EVAL_EVERY), compare=compare,
                     init_scheme="torch")
    if name.startswith("fmnist"):
        data = dict(task="fashion_mnist", input_type="continuous",
                    resolution={196: 14, 784: 28}[g["length"]],
                    test_examples=g.get("test_examples", TEST_EXAMPLES))
        c = cpu_sized.comparison(model, regime, data=data, generate={}, target="l1",
                                   **common_kw)
    else:
        data = dict(task="code_bytes", input_type="tokens", max_length=g["length"],
                    test_examples=TEST_EXAMPLES, code_bytes=dict(window=2048))
        c = cpu_sized.comparison(model, regime, data=data, generate={}, mask_rate=0.15,
                                   **common_kw)
    with c.unlocked():
        for s in ("pretrain", "finetune", "scratch"):
            c.stages[s].eval_steps = (g.get("eval_steps", EVAL_STEPS) if name.startswith("fmnist")
                                      else 0)  # code: all
            c.stages[s].patience = g.get("patience", 0)
            # 256 windows of 2,048 bytes through S4D hold ~6 GB on the host: 32 for code.
            c.stages[s].eval_batch_size = 256 if name.startswith("fmnist") else 32
        c.compare.lrs = lrs
        c.compare.lr_seeds = LR_SEEDS
        if g.get("patience"):  # equal compute: the steps each seed's SPT run spent
            c.compare.equal_compute = equal_compute.SPENT
    c.lock()
    return c
