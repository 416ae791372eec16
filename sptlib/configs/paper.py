"""The paper's task presets: sizes, optimisers, budgets, SPT mask rates and target TPU slices.

`TASKS[task]` holds one `Recipe` for Transformers and one for SSMs, plus the DLR, S4D and DSS
recipes where the release has their files (`TaskSpec.models`; every other SSM of the zoo uses the
S4 recipe). A recipe describes the finetune stage (which the scratch baseline copies) and lists
in `pretrain` the fields where the authors' SPT pretraining config differs. The source is the
authors' released configs (IdoAmos/not-from-scratch at f919137, `configs/experiment/{lra,cifar,
sc}/` with the defaults they include), composed by hydra into `tests/release/released.json` and
compared value for value in `tests/test_config_fidelity.py`; every remaining difference is a row
of the deviation table in docs/reproducing.md ("Deviations from the released configs").

This module is the one home of the per-task masking rates.
"""

from __future__ import annotations

import dataclasses

# The regimes every model can be judged under, in report order (here, JAX-free, so that the
# report reads the same tuple the config builders check against).
REGIMES = ("scratch", "scratch-equal-compute", "spt-masked", "spt-causal", "mlpinit")

# Fields a `Recipe.pretrain` override may set: the stage's optimiser and budget (one model for
# both stages, so that the pretrained backbone loads into the finetuning model), and the
# pretraining target where a released pretraining file sets its own.
STAGE_FIELDS = ("batch_size", "lr", "weight_decay", "epochs", "warmup_steps", "schedule",
                "ssm_lr", "dt_lr", "decay_steps", "target")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Sizes and optimiser of one model family on one task.

    The fields describe the finetune stage (and the scratch baseline); `pretrain` maps
    `STAGE_FIELDS` names to the SPT pretrain stage's values where they differ.
    """

    n_layers: int
    d_model: int
    batch_size: int
    lr: float
    weight_decay: float
    epochs: float
    warmup_steps: int = 0
    schedule: str = "cosine"
    ssm_lr: float = 1e-3
    # lr of the SSM step sizes: None = ssm_lr; "lr" = the stage's global lr (the paper code's
    # `lr: {dt: null, A: .., B: ..}`: log dt at the global lr, without weight decay).
    dt_lr: float | str | None = None
    # Cosine horizon in steps (the paper code's `num_training_steps`); 0 = the stage's steps.
    decay_steps: int = 0
    n_heads: int = 8
    ffn_mult: int = 0
    norm: str = "layer"
    prenorm: bool = True
    dropout: float = 0.0
    tie_dropout: bool = False  # one dropout mask per (example, feature), shared over positions
    window: int = 0  # local attention band |i - j| <= window (0 = full attention)
    pooling: str = "mean"
    positions: str = "sinusoidal"  # attention models: sinusoidal (added) | rotary
    dt_min: float | None = None  # SSM step-size init range; None = the mixer's default
    dt_max: float | None = None
    # Options of the mixer's own config section (e.g. `config.model.s4.n_ssm`).
    mixer: dict = dataclasses.field(default_factory=dict)
    # Classifier head: hidden width of an MLP on the pooled features (0 = linear), activation.
    head_hidden: int = 0
    head_activation: str = "relu"
    target: str = ""  # masked-SPT target where it is not the task's (TaskSpec.target)
    remat: bool = False  # rematerialise each layer in the backward pass (long sequences)
    slice: str = ""  # this model's TPU slice where it needs another than the task's TaskSpec.slice
    pretrain: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        unknown = set(self.pretrain) - set(STAGE_FIELDS)
        if unknown:
            raise ValueError(f"Recipe.pretrain sets {sorted(unknown)}; only the stage fields "
                             f"{STAGE_FIELDS} may differ between pretraining and finetuning")

    def stage(self, name: str) -> "Recipe":
        """The recipe of stage `name` (pretrain | finetune | scratch)."""
        return dataclasses.replace(self, **self.pretrain) if name == "pretrain" else self


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One paper task: data settings, SPT mask rate, the S4 and Transformer recipes, target slice."""

    data: dict
    num_train: int
    mask_rate: float
    ssm: Recipe
    transformer: Recipe
    # Continuous inputs: masked-SPT reconstruction target (pixel256 | l1); '' for token tasks.
    target: str = ""
    d_input: int = 1
    objective: str = "classify"  # retrieval for the dual-encoder task
    # TPU slice the paper-size config is sized for (config.aot.slice; see sptlib.slices.meshes): per-chip
    # batch and activations of the longest stage fit a v4 chip's 32 GiB HBM.
    slice: str = "v4-8"
    # Recipes of other model families where the release has their own files (dlr, s4d, dss);
    # every other SSM uses `ssm`.
    models: dict = dataclasses.field(default_factory=dict)
    # Validation (and best-checkpoint selection) every this many epochs of the pretraining stage
    # (the continuous-input `*-lm` pipelines validate every half epoch); other stages: 1.
    pretrain_eval_epochs: float = 1.0
    paper: str = ""  # the paper's numbers to expect, for docstrings / docs/reproducing.md


# Reading guide: Recipe(n_layers, d_model, batch_size, lr, weight_decay, epochs, ...), each from
# the released file named above it (IdoAmos/not-from-scratch at f919137, configs/experiment/;
# tests/release/released.json holds every value). The S4 files with `lr: {dt: null, A, B}` give
# log dt the global lr (dt_lr="lr"); a scalar `lr` covers all three. `n_ssm` equal to d_model (or
# null) is one copy per channel (0).
_S4 = dict(tie_dropout=True)  # model/s4.yaml: tie_dropout: true
# lr.Lambda = lr.W = 1e-4 (W without weight decay); Lambda_init omega over the layer's
# dt_min/dt_max (model/layer/dlr.yaml; the experiment files' `lr.dt_min` are never read).
_DLR = dict(ssm_lr=1e-4, dt_min=1e-4, dt_max=1e-1,
            mixer=dict(c_in_ssm_group=True, theta_init="omega"))
_S4D = dict(init_kind="legs", discretization="bilinear")  # measure diag-legs; SSKernelDiag disc

# lra/s4-lra-pathx(-mlm).yaml; PathX-256 has no released S4 config and uses it at 256 x 256.
_PATHX_S4 = Recipe(6, 256, 16, 5e-4, 0.05, 50, warmup_steps=10_000, ssm_lr=5e-4, norm="batch",
                   dt_min=1e-4, dt_max=1e-1, decay_steps=500_000, remat=True, **_S4,
                   pretrain=dict(batch_size=32, warmup_steps=5000, schedule="constant"))

TASKS: dict[str, TaskSpec] = {
    "listops": TaskSpec(
        data=dict(task="listops", input_type="tokens", max_length=2048),  # dataset.l_max
        num_train=96_000, mask_rate=0.10,
        # lra/s4-lra-listops(-mlm).yaml
        ssm=Recipe(8, 128, 50, 0.01, 0.05, 40, warmup_steps=2000, schedule="constant",
                   norm="batch", prenorm=False, dt_min=1e-3, dt_max=1e-1, dt_lr="lr", **_S4,
                   pretrain=dict(epochs=100)),
        # lra/transformer-lra-listops(-mlm).yaml
        # remat off (not a released value: a memory/speed setting): on a v4-8 libtpu's
        # model-FLOP bound is 53.3% without remat against 42.0% with it (recomputation is no
        # useful work), at 4.9 instead of 1.3 GiB per chip (`sptlib.aot`, 2026-12-06).
        transformer=Recipe(6, 512, 32, 0.05, 0.0, 100, warmup_steps=2000, schedule="constant",
                           n_heads=8, ffn_mult=4),
        # lra/dlr-lra-listops(-mlm).yaml
        models=dict(dlr=Recipe(8, 128, 50, 0.01, 0.05, 40, warmup_steps=2000,
                               schedule="constant", norm="layer", prenorm=False, **_DLR,
                               pretrain=dict(epochs=100))),
        paper="S4 59.60 (scratch); Transformer 36.37 (scratch, LRA paper). SPT: paper Table 1."),
    "text": TaskSpec(
        data=dict(task="text", input_type="tokens"), num_train=25_000, mask_rate=0.15,
        # lra/s4-lra-imdb(-mlm).yaml
        ssm=Recipe(6, 256, 16, 0.01, 0.05, 32, warmup_steps=5000, norm="batch", dt_min=1e-3,
                   dt_max=1e-1, dt_lr="lr", decay_steps=50_000, remat=True, **_S4,
                   pretrain=dict(warmup_steps=1000, schedule="constant")),
        # lra/transformer-lra-imdb(-mlm).yaml; finetuning constant since 86acc52 (2023-11-17),
        # `sequence_nonelinear` decoder: Linear(d, d) -> ReLU -> Linear.
        # remat off as ListOps: bound 59.5% against 46.9%, 9.6 GiB per chip of 32 (v4-8).
        transformer=Recipe(6, 512, 32, 0.05, 0.1, 65, warmup_steps=2000, schedule="constant",
                           n_heads=8, ffn_mult=4, head_hidden=512,
                           pretrain=dict(epochs=32, warmup_steps=5000)),
        # lra/dlr-lra-imdb(-mlm).yaml
        models=dict(dlr=Recipe(6, 256, 16, 0.01, 0.05, 32, warmup_steps=2000,
                               schedule="constant", norm="layer", remat=True, **_DLR,
                               pretrain=dict(warmup_steps=1000))),
        paper="S4 86.82 (scratch); Transformer 64.27 (scratch, LRA paper). SPT: paper Table 1."),
    "retrieval": TaskSpec(
        data=dict(task="retrieval", input_type="tokens"), num_train=147_086, mask_rate=0.15,
        # lra/s4-lra-aan(-mlm).yaml
        ssm=Recipe(6, 256, 64, 0.01, 0.05, 20, warmup_steps=2500, schedule="constant",
                   norm="batch", dt_min=1e-3, dt_max=1e-1, dt_lr="lr", remat=True, **_S4),
        # lra/transformer-lra-aan(-mlm).yaml
        transformer=Recipe(4, 128, 32, 0.05, 0.0, 32, warmup_steps=5000, schedule="constant",
                           n_heads=4, ffn_mult=4, remat=True, pretrain=dict(warmup_steps=2000)),
        objective="retrieval",
        paper="S4 90.90 (scratch); Transformer 57.46 (scratch, LRA paper). SPT: paper Table 1."),
    "image": TaskSpec(
        data=dict(task="image", input_type="continuous"), num_train=45_000, mask_rate=0.50,
        # lra/s4-lra-cifar(-mlm).yaml (pretraining: constant_warmup's 1,000 warmup steps)
        ssm=Recipe(6, 512, 50, 0.01, 0.05, 200, warmup_steps=1000, norm="layer", prenorm=False,
                   dropout=0.1, dt_min=1e-3, dt_max=1e-1, dt_lr="lr", decay_steps=200_000,
                   mixer=dict(n_ssm=2), **_S4, pretrain=dict(schedule="constant")),
        # lra/transformer-lra-cifar(-mlm).yaml (`sequence_nonelinear` decoder)
        transformer=Recipe(3, 64, 50, 1e-3, 0.0, 200, warmup_steps=2000, schedule="constant",
                           n_heads=4, ffn_mult=2, head_hidden=64,
                           pretrain=dict(batch_size=32, epochs=50, warmup_steps=2500)),
        models=dict(
            # lra/dlr-lra-cifar(-mlm).yaml
            dlr=Recipe(6, 512, 50, 0.01, 0.05, 200, warmup_steps=1000, schedule="constant",
                       norm="layer", **_DLR),
            # lra/s4d-lra-cifar.yaml (no released pretraining file: the S4 one's schedule)
            s4d=Recipe(6, 512, 50, 0.01, 0.05, 200, warmup_steps=1000, norm="layer",
                       prenorm=False, dropout=0.1, dt_min=1e-3, dt_max=1e-1, dt_lr="lr",
                       decay_steps=200_000, mixer=dict(n_ssm=2, **_S4D), **_S4,
                       pretrain=dict(schedule="constant"))),
        target="l1",
        pretrain_eval_epochs=0.5,
        paper="S4 88.65 (scratch); Transformer 42.44 (scratch, LRA paper). SPT: paper Table 1."),
    "pathfinder": TaskSpec(
        data=dict(task="pathfinder", input_type="continuous", resolution=32),
        num_train=160_000, mask_rate=0.50,
        # lra/s4-lra-pathfinder(-mlm).yaml (scalar lr: dt, A, B at 1e-3)
        ssm=Recipe(6, 256, 64, 0.004, 0.03, 200, warmup_steps=2500, schedule="constant",
                   norm="batch", pooling="last", dt_min=1e-3, dt_max=1e-1, **_S4),
        # lra/transformer-lra-pathfinder(-mlm).yaml
        transformer=Recipe(4, 128, 32, 5e-4, 0.0, 200, warmup_steps=5000, schedule="constant",
                           n_heads=8, ffn_mult=1, pretrain=dict(epochs=50, warmup_steps=2500)),
        target="pixel256",
        pretrain_eval_epochs=0.5,
        paper="S4 94.20 (scratch); Transformer 71.40 (scratch, LRA paper). SPT: paper Table 1."),
    "pathx": TaskSpec(
        data=dict(task="pathx", input_type="continuous", resolution=128),
        num_train=160_000, mask_rate=0.50,
        ssm=_PATHX_S4,
        # lra/transformer-lra-pathx-small.yaml, lra/transformer-lra-pathx-mlm-small.yaml
        # remat off as ListOps (a memory/speed setting): the masked pretraining's model-FLOP
        # bound 24.8% with remat, 32.4% without (v4-16, 2026-12-06), 35.0% with the splash
        # layout of 2026-12-07 and 43.0% at 2.5 GiB per chip of 32 with the band backward
        # (docs/benchmarks.md).
        transformer=Recipe(4, 128, 32, 5e-4, 0.0, 200, warmup_steps=5000, schedule="constant",
                           n_heads=4, ffn_mult=1, window=4096, pooling="max"),
        models=dict(
            # lra/dlr-lra-pathx(-mlm).yaml
            dlr=Recipe(6, 256, 32, 5e-4, 0.05, 50, warmup_steps=5000, norm="layer",
                       decay_steps=250_000, remat=True, **_DLR,
                       pretrain=dict(schedule="constant")),
            # lra/s4d-lra-pathx-small.yaml (scalar lr 5e-4; no released pretraining file)
            s4d=Recipe(4, 96, 32, 5e-4, 0.05, 50, warmup_steps=5000, ssm_lr=5e-4,
                       norm="batch", dt_min=1e-4, dt_max=1e-2, decay_steps=250_000,
                       mixer=dict(**_S4D), remat=True, **_S4,
                       pretrain=dict(schedule="constant")),
            # lra/dss-pathfinder-lm.yaml (resolution 128: PathX pretraining; L1 target). No
            # released finetuning file: the same optimiser for finetuning.
            dss=Recipe(5, 128, 16, 1e-4, 0.0, 30, warmup_steps=3000, ssm_lr=1e-4,
                       norm="layer", decay_steps=150_000, remat=True,
                       pretrain=dict(target="l1"))),
        target="pixel256", slice="v4-16",
        pretrain_eval_epochs=0.5,
        paper="S4 96.35 (scratch); Transformer fails (50, scratch); Transformer + causal SPT "
              "88.05."),
    "pathx256": TaskSpec(
        data=dict(task="pathx256", input_type="continuous", resolution=256),
        num_train=160_000, mask_rate=0.50,
        # No released S4 PathX-256 config: the S4 PathX recipe at 256 x 256.
        ssm=_PATHX_S4,
        # lra/transformer-lra-pathx256(-mlm).yaml
        # remat off as PathX (a memory/speed setting): with the band backward of 2026-12-07
        # the masked pretraining's model-FLOP bound on a v4-64 is 50.2% at 3.8 GiB per chip
        # against 37.1% with remat (`sptlib.aot`). The v4-64 dates from splash's own backward,
        # when a v4-32 (per-chip batch 2) needed 42.2 GiB per chip; now a v4-32 fits (7.5 GiB,
        # bound 47.5%).
        transformer=Recipe(4, 128, 32, 5e-4, 0.0, 200, warmup_steps=5000, schedule="constant",
                           n_heads=4, ffn_mult=4, window=8192, pooling="max",
                           slice="v4-64"),
        target="pixel256", slice="v4-32",
        pretrain_eval_epochs=0.5,
        paper="S4 67.82 (scratch) -> 87.11 (SPT)."),
    "scifar": TaskSpec(
        data=dict(task="scifar", input_type="continuous"), num_train=45_000, mask_rate=0.50,
        # cifar/s4-cifar(-lm).yaml (lr.dt 1e-3: all three at the SSM lr)
        ssm=Recipe(6, 512, 50, 0.01, 0.05, 200, warmup_steps=1000, norm="layer", prenorm=False,
                   dropout=0.1, dt_min=1e-3, dt_max=1e-1, decay_steps=200_000,
                   mixer=dict(n_ssm=2), **_S4,
                   pretrain=dict(warmup_steps=2000, schedule="constant")),
        # cifar/transformer-cifar(-lm).yaml (`sequence_nonelinear` decoder)
        transformer=Recipe(6, 256, 50, 1e-3, 0.05, 200, warmup_steps=2000, schedule="constant",
                           n_heads=4, ffn_mult=2, positions="rotary", head_hidden=256),
        target="l1", d_input=3,
        pretrain_eval_epochs=0.5,
        paper="S4 ~91 (scratch, S4 paper); SPT: paper section 3.7."),
    "speech_commands": TaskSpec(
        data=dict(task="speech_commands", input_type="continuous"), num_train=84_843,
        mask_rate=0.25,
        # sc/s4-sc(-lm).yaml (both stages cosine over a 200,000-step horizon)
        ssm=Recipe(6, 128, 16, 0.01, 0.05, 40, warmup_steps=1000, norm="batch", pooling="max",
                   dt_min=1e-3, dt_max=1e-1, decay_steps=200_000, mixer=dict(n_ssm=64),
                   remat=True, **_S4),
        # sc/transformer-sc(-lm).yaml. Released: a plateau schedule (patience 10 epochs) for
        # finetuning; see the deviations.
        # remat off as PathX (a memory/speed setting): model-FLOP bound 39.4% at 2.5 GiB per
        # chip of a v4-8 against 28.8% with remat (`sptlib.aot`, 2026-12-07, band backward).
        transformer=Recipe(4, 128, 16, 1e-3, 0.05, 200, schedule="constant", n_heads=4,
                           ffn_mult=1, window=4000, pooling="max", positions="rotary",
                           pretrain=dict(warmup_steps=2000)),
        target="l1",
        paper="S4 ~96-98 (scratch, raw audio); SPT: paper section 3.7."),
}
