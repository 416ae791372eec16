"""The paper's task presets: sizes, optimisers, budgets, SPT mask rates and target TPU slices.

`TASKS[task]` holds one `Recipe` for Transformers and one for SSMs (every SSM of the zoo uses the
S4 recipe). A recipe describes the finetune stage (which the scratch baseline copies) and lists
in `pretrain` the fields where the authors' SPT pretraining config differs. The source is the
authors' released configs (IdoAmos/not-from-scratch, `configs/experiment/{lra,cifar,sc}/`, with
the state-spaces/s4 defaults they inherit), transcribed independently into
`tests/paper_configs.py` and compared field by field in `tests/test_config_fidelity.py`, which
also names every deliberate deviation and its reason (docs/reproducing.md, "Deviations from
the released configs").

This module is the one home of the per-task masking rates.
"""

from __future__ import annotations

import dataclasses

# The regimes every model can be judged under, in report order (here, JAX-free, so that the
# report reads the same tuple the config builders check against).
REGIMES = ("scratch", "scratch-equal-compute", "spt-masked", "spt-causal", "mlpinit")

# Fields a `Recipe.pretrain` override may set: the stage's optimiser and budget (one model for
# both stages, so that the pretrained backbone loads into the finetuning model).
STAGE_FIELDS = ("batch_size", "lr", "weight_decay", "epochs", "warmup_steps", "schedule",
                "ssm_lr")


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
    n_heads: int = 8
    ffn_mult: int = 0
    norm: str = "layer"
    prenorm: bool = True
    dropout: float = 0.0
    window: int = 0  # local attention band |i - j| <= window (0 = full attention)
    pooling: str = "mean"
    positions: str = "sinusoidal"  # attention models: sinusoidal (added) | rotary
    dt_min: float | None = None  # SSM step-size init range; None = the mixer's default
    dt_max: float | None = None
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
    # TPU slice the paper-size config is sized for (config.aot.slice; see sptlib.meshes): per-chip
    # batch and activations of the longest stage fit a v4 chip's 32 GiB HBM.
    slice: str = "v4-8"
    paper: str = ""  # the paper's numbers to expect, for docstrings / docs/reproducing.md


# Reading guide: Recipe(n_layers, d_model, batch_size, lr, weight_decay, epochs, ...). S4 recipes
# keep the released ssm_lr (the lr of A and B; see the deviations in docs/reproducing.md).

# The released S4 PathX recipe; PathX-256 has no released S4 config and uses it at 256 x 256.
_PATHX_S4 = Recipe(6, 256, 16, 5e-4, 0.05, 50, warmup_steps=10_000, ssm_lr=5e-4, norm="batch",
                   dt_min=1e-4, dt_max=1e-1, remat=True,
                   pretrain=dict(batch_size=32, warmup_steps=5000, schedule="constant"))

TASKS: dict[str, TaskSpec] = {
    "listops": TaskSpec(
        data=dict(task="listops", input_type="tokens"), num_train=96_000, mask_rate=0.10,
        ssm=Recipe(8, 128, 50, 0.01, 0.05, 40, warmup_steps=2000, schedule="constant",
                   norm="batch", prenorm=False, dt_min=1e-3, dt_max=1e-1,
                   pretrain=dict(epochs=100)),
        transformer=Recipe(6, 512, 32, 0.05, 0.0, 100, warmup_steps=2000, schedule="constant",
                           n_heads=8, ffn_mult=4),
        paper="S4 59.60 (scratch); Transformer 36.37 (scratch, LRA paper). SPT: paper Table 1."),
    "text": TaskSpec(
        data=dict(task="text", input_type="tokens"), num_train=25_000, mask_rate=0.15,
        ssm=Recipe(6, 256, 16, 0.01, 0.05, 32, warmup_steps=5000, norm="batch", dt_min=1e-3,
                   dt_max=1e-1, remat=True,
                   pretrain=dict(warmup_steps=1000, schedule="constant")),
        transformer=Recipe(6, 512, 32, 0.05, 0.1, 65, warmup_steps=2000, n_heads=8, ffn_mult=4,
                           remat=True,
                           pretrain=dict(epochs=32, warmup_steps=5000, schedule="constant")),
        paper="S4 86.82 (scratch); Transformer 64.27 (scratch, LRA paper). SPT: paper Table 1."),
    "retrieval": TaskSpec(
        data=dict(task="retrieval", input_type="tokens"), num_train=147_086, mask_rate=0.15,
        ssm=Recipe(6, 256, 64, 0.01, 0.05, 20, warmup_steps=2500, schedule="constant",
                   norm="batch", dt_min=1e-3, dt_max=1e-1, remat=True),
        transformer=Recipe(4, 128, 32, 0.05, 0.0, 32, warmup_steps=5000, schedule="constant",
                           n_heads=4, ffn_mult=4, remat=True, pretrain=dict(warmup_steps=2000)),
        objective="retrieval",
        paper="S4 90.90 (scratch); Transformer 57.46 (scratch, LRA paper). SPT: paper Table 1."),
    "image": TaskSpec(
        data=dict(task="image", input_type="continuous"), num_train=45_000, mask_rate=0.50,
        ssm=Recipe(6, 512, 50, 0.01, 0.05, 200, warmup_steps=1000, norm="layer", prenorm=False,
                   dropout=0.1, dt_min=1e-3, dt_max=1e-1, pretrain=dict(schedule="constant")),
        transformer=Recipe(3, 64, 50, 1e-3, 0.0, 200, warmup_steps=2000, schedule="constant",
                           n_heads=4, ffn_mult=2,
                           pretrain=dict(batch_size=32, epochs=50, warmup_steps=2500)),
        target="l1",
        paper="S4 88.65 (scratch); Transformer 42.44 (scratch, LRA paper). SPT: paper Table 1."),
    "pathfinder": TaskSpec(
        data=dict(task="pathfinder", input_type="continuous", resolution=32),
        num_train=160_000, mask_rate=0.50,
        ssm=Recipe(6, 256, 64, 0.004, 0.03, 200, warmup_steps=2500, schedule="constant",
                   norm="batch", pooling="last", dt_min=1e-3, dt_max=1e-1),
        transformer=Recipe(4, 128, 32, 5e-4, 0.0, 200, warmup_steps=5000, schedule="constant",
                           n_heads=8, ffn_mult=1, pretrain=dict(epochs=50, warmup_steps=2500)),
        target="pixel256",
        paper="S4 94.20 (scratch); Transformer 71.40 (scratch, LRA paper). SPT: paper Table 1."),
    "pathx": TaskSpec(
        data=dict(task="pathx", input_type="continuous", resolution=128),
        num_train=160_000, mask_rate=0.50,
        ssm=_PATHX_S4,
        transformer=Recipe(4, 128, 32, 5e-4, 0.0, 200, warmup_steps=5000, schedule="constant",
                           n_heads=4, ffn_mult=1, window=4096, pooling="max", remat=True),
        target="pixel256", slice="v4-16",
        paper="S4 96.35 (scratch); Transformer fails (50, scratch); Transformer + causal SPT "
              "88.05."),
    "pathx256": TaskSpec(
        data=dict(task="pathx256", input_type="continuous", resolution=256),
        num_train=160_000, mask_rate=0.50,
        # No released S4 PathX-256 config: the S4 PathX recipe at 256 x 256.
        ssm=_PATHX_S4,
        transformer=Recipe(4, 128, 32, 5e-4, 0.0, 200, warmup_steps=5000, schedule="constant",
                           n_heads=4, ffn_mult=4, window=8192, pooling="max", remat=True,
                           # Compiled for a v4-32 (per-chip batch 2): 42.2 GiB per chip.
                           slice="v4-64"),
        target="pixel256", slice="v4-32",
        paper="S4 67.82 (scratch) -> 87.11 (SPT)."),
    "scifar": TaskSpec(
        data=dict(task="scifar", input_type="continuous"), num_train=45_000, mask_rate=0.50,
        ssm=Recipe(6, 512, 50, 0.01, 0.05, 200, warmup_steps=1000, norm="layer", prenorm=False,
                   dropout=0.1, dt_min=1e-3, dt_max=1e-1,
                   pretrain=dict(warmup_steps=2000, schedule="constant")),
        transformer=Recipe(6, 256, 50, 1e-3, 0.05, 200, warmup_steps=2000, schedule="constant",
                           n_heads=4, ffn_mult=2, positions="rotary"),
        target="l1", d_input=3,
        paper="S4 ~91 (scratch, S4 paper); SPT: paper section 3.7."),
    "speech_commands": TaskSpec(
        data=dict(task="speech_commands", input_type="continuous"), num_train=84_843,
        mask_rate=0.25,
        ssm=Recipe(6, 128, 16, 0.01, 0.05, 40, warmup_steps=1000, norm="batch", pooling="max",
                   dt_min=1e-3, dt_max=1e-1, remat=True),
        # Released: a plateau schedule (patience 10 epochs) for finetuning; see the deviations.
        transformer=Recipe(4, 128, 16, 1e-3, 0.05, 200, schedule="constant", n_heads=4,
                           ffn_mult=1, window=4000, pooling="max", positions="rotary",
                           remat=True, pretrain=dict(warmup_steps=2000)),
        target="l1",
        paper="S4 ~96-98 (scratch, raw audio); SPT: paper section 3.7."),
}
