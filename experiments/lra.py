r"""Long Range Arena (+ PathX-256) at the paper's sizes: any task × model × regime.

    get_config("<task>,<model>,<regime>[,scale=<f>][,grid=<name>][,mlpinit_objective=<o>]")

task    listops | text | retrieval | image | pathfinder | pathx | pathx256 |
        listops-cpu (a CPU-sized generated ListOps, below)
model   transformer | transformer-causal | s4 | s4d | dss | gss | gss-hybrid | dlr | s5 |
        transformer-deep | transformer-wide | transformer-wide2 (L/2 layers x 2H heads, equal
        parameters) | bow (the bag-of-words control; sptlib/configs/variants.py)
regime  scratch | scratch-equal-compute | spt-masked | spt-causal | mlpinit (mixers bypassed
        for the pretraining steps, then finetuned with fresh mixers)
scale   multiplies every stage's steps (default 1 = the paper's epochs)
grid    the `compare` section: lra (Transformer and S4 × scratch, spt-masked; default),
        zoo (every model × scratch, spt-masked), dlr (DLR vs S4), causal (Transformer,
        causal Transformer × scratch, spt-masked, spt-causal), wide (Transformer deep,
        wide2, wide × scratch), priors (Transformer and S4D × scratch, spt-masked, mlpinit);
        3 seeds each; every grid holds the `bow` control (scratch only).
mlpinit_objective  stage 1 of mlpinit: classify (the task's labels; default: a per-token model
        under the masked objective sees only <mask> where it is scored) | masked.

One run (pretrain then finetune, each in WORKDIR/<stage>/):
    python -m sptlib.main --config=experiments/lra.py:image,transformer,spt-masked --workdir=W
The whole paper row with confidence intervals:
    python -m sptlib.compare --config=experiments/lra.py:image --workdir=W
CPU-sized grids (generated ListOps; times and tables in docs/reproducing.md):
    python -m sptlib.compare --config=experiments/lra.py:listops-cpu,grid=priors --workdir=W
    python -m sptlib.compare --config=experiments/lra.py:listops-cpu,grid=wide --workdir=W

Data: the LRA release under `--config.data.lra_dir` (ListOps, Retrieval, Pathfinder, PathX) and
TFDS (`imdb_reviews` for Text, `cifar10` for Image); see docs/reproducing.md.

Sizes, optimisers, budgets and mask rates follow the authors' released configs, pretraining and
finetuning files each (`sptlib/configs/paper.py`; checked field by field in
tests/test_config_fidelity.py; deviations in docs/reproducing.md). Each config names its target
TPU slice (`config.aot.slice`: v4-8, v4-16 for PathX, v4-32 for PathX-256's S4, v4-64 for its
Transformer) and mesh; the PathX and PathX-256 Transformers use local attention (windows 4,096 / 8,192) and the long-sequence
tasks rematerialise each layer.

Paper numbers to expect (test accuracy; Amos et al. 2024 Table 1, S4 paper, LRA paper):
    ListOps     S4 59.60   Transformer 36.37   (scratch)
    Text        S4 86.82   Transformer 64.27   (scratch)
    Retrieval   S4 90.90   Transformer 57.46   (scratch)
    Image       S4 88.65   Transformer 42.44   (scratch)
    Pathfinder  S4 94.20   Transformer 71.40   (scratch)
    PathX       S4 96.35   Transformer fails (50); Transformer + causal SPT 88.05
    PathX-256   S4 67.82 (scratch) -> 87.11 (masked SPT)
    Mean over the six LRA tasks: Transformer 53.60 -> 86.21 with SPT; S4 86.09 -> 86.75.
    DLR vs S4 (ListOps, Text, Image, PathX mean): DLR ~77 -> 83.4, S4 ~83 -> 84.5 with SPT.
"""

from sptlib.configs import common, cpu_sized, paper, presets, variants

POSITIONAL = ("task", "model", "regime")
TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx", "pathx256")
CPU_TASKS = ("listops-cpu",)
GRIDS = {
    "lra": (("transformer", "s4"), ("scratch", "spt-masked")),
    "zoo": (presets.MODELS, ("scratch", "spt-masked")),
    "dlr": (("s4", "dlr"), ("scratch", "spt-masked")),
    "causal": (("transformer", "transformer-causal"), ("scratch", "spt-masked", "spt-causal")),
    "wide": (("transformer-deep", "transformer-wide2", "transformer-wide"), ("scratch",)),
    "priors": (("transformer", "s4d"), ("scratch", "spt-masked", "mlpinit")),
}
# The bag-of-words control joins every grid (it runs under scratch only).
CONTROLS = variants.CONTROLS

# listops-cpu: generated ListOps, 16 < length < 64 source tokens, sized for minutes per run on a
# CPU. Measured with both grids running together on a shared 2-core machine (load 6-11): wide
# 28 min, priors 40 min, 3 seeds each (docs/reproducing.md); idle-machine times not measured. The
# wide grid's deep Transformer has 4 layers x 2 heads so that k = 2 (2 x 4) and k = 4 (1 x 8) differ.
CPU = dict(num_train=8000, num_eval=500, min_length=16, max_length=64, d_model=64,
           batch_size=32, lr=2e-3, steps=400, pretrain_steps=400, eval_every=100, d_state=64)
CPU_SIZES = {"wide": dict(n_layers=4, n_heads=2), "priors": dict(n_layers=2, n_heads=4)}


def get_config(arg="listops,s4,spt-masked"):
    a = common.parse_arg(arg, POSITIONAL)
    task, grid = a.get("task", "listops"), a.get("grid", "lra")
    if task not in TASKS + CPU_TASKS:
        raise ValueError(f"experiments/lra.py: unknown task {task!r}; known: "
                         f"{TASKS + CPU_TASKS}")
    if grid not in GRIDS:
        raise ValueError(f"experiments/lra.py: unknown grid {grid!r}; known: {sorted(GRIDS)}")
    models, regimes = GRIDS[grid]
    if task in TASKS and paper.TASKS[task].transformer.n_layers % 2:
        # An odd depth has no L/2 x 2H variant (Image: 3 layers).
        models = tuple(m for m in models if m != "transformer-wide2")
    compare = dict(models=models + CONTROLS, regimes=regimes, seeds=(0, 1, 2))
    model, regime = a.get("model", "s4"), a.get("regime", "spt-masked")
    objective = a.get("mlpinit_objective", "classify")
    if task == "listops-cpu":
        steps = int(a.get("steps", CPU["steps"]))
        sizes = dict(CPU, steps=steps, pretrain_steps=int(a.get("pretrain_steps", steps)),
                     **CPU_SIZES.get(grid, CPU_SIZES["priors"]))
        return cpu_sized.listops(
            model, regime, **sizes, mlpinit_objective=objective,
            compare=dict(compare, title=f"ListOps (generated, CPU-sized), {grid} grid"))
    config = presets.build(task, model, regime, scale=float(a.get("scale", 1.0)),
                           mlpinit_objective=objective)
    with config.unlocked():
        presets.add_compare(config, **compare,
                            title=f"LRA {task} ({grid} grid, paper sizes)")
    return config
