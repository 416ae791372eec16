r"""Long Range Arena (+ PathX-256) at the paper's sizes: any task × model × regime.

    get_config("<task>,<model>,<regime>[,scale=<f>][,grid=<name>]")

task    listops | text | retrieval | image | pathfinder | pathx | pathx256
model   transformer | transformer-causal | s4 | s4d | dss | gss | gss-hybrid | dlr | s5
regime  scratch | scratch-equal-compute | spt-masked | spt-causal
scale   multiplies every stage's steps (default 1 = the paper's epochs)
grid    the `compare` section: lra (Transformer and S4 × scratch, spt-masked; default),
        zoo (every model × scratch, spt-masked), dlr (DLR vs S4), causal (Transformer,
        causal Transformer × scratch, spt-masked, spt-causal); 3 seeds each.

One run (pretrain then finetune, each in WORKDIR/<stage>/):
    python -m sptlib.main --config=experiments/lra.py:image,transformer,spt-masked --workdir=W
The whole paper row with confidence intervals:
    python -m sptlib.compare --config=experiments/lra.py:image --workdir=W

Data: the LRA release under `--config.data.lra_dir` (ListOps, Retrieval, Pathfinder, PathX) and
TFDS (`imdb_reviews` for Text, `cifar10` for Image); see docs/reproducing.md.

Sizes, optimisers, budgets and mask rates follow the authors' released configs, pretraining and
finetuning files each (`sptlib/paper_presets.py`; checked field by field in
tests/test_config_fidelity.py; deviations in docs/reproducing.md). Each config names its target
TPU slice (`config.aot.slice`: v4-8, v4-16 for PathX, v4-32 for PathX-256) and mesh; the PathX
and PathX-256 Transformers use local attention (windows 4,096 / 8,192) and the long-sequence
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

from sptlib import experiments_lib as lib

POSITIONAL = ("task", "model", "regime")
TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx", "pathx256")
GRIDS = {
    "lra": (("transformer", "s4"), ("scratch", "spt-masked")),
    "zoo": (lib.MODELS, ("scratch", "spt-masked")),
    "dlr": (("s4", "dlr"), ("scratch", "spt-masked")),
    "causal": (("transformer", "transformer-causal"), ("scratch", "spt-masked", "spt-causal")),
}


def get_config(arg="listops,s4,spt-masked"):
    a = lib.parse_arg(arg, POSITIONAL)
    task = a.get("task", "listops")
    if task not in TASKS:
        raise ValueError(f"experiments/lra.py: unknown task {task!r}; known: {TASKS}")
    config = lib.build(task, a.get("model", "s4"), a.get("regime", "spt-masked"),
                       scale=float(a.get("scale", 1.0)))
    models, regimes = GRIDS[a.get("grid", "lra")]
    with config.unlocked():
        lib.add_compare(config, models=models, regimes=regimes, seeds=(0, 1, 2),
                        title=f"LRA {task} ({a.get('grid', 'lra')} grid, paper sizes)")
    return config
