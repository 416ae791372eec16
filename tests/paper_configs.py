"""The authors' released configs, transcribed by hand: the independent truth that
`tests/test_config_fidelity.py` compares the presets (`sptlib/configs/paper.py`) with.

Source: github.com/IdoAmos/not-from-scratch (a fork of state-spaces/s4), `configs/experiment/`
`lra/`, `cifar/` (sCIFAR) and `sc/` (Speech Commands); `*-mlm.yaml` / `*-lm.yaml` files are the
SPT pretraining runs, the others finetuning (and scratch, run without a checkpoint). Values a file
leaves to its hydra `defaults` come from the file named in `source` after a `+`. Where the stored
index holds two versions of a file (commits a6b3f9f and 5eecebc), the 5eecebc one is transcribed:
its PathX Transformer file is the one the later PathX-256 file (9a317f5) copies line for line
(both set `rotary: false` and `decoder.mode: max`). The a6b3f9f versions differ only in
the PathX Transformer finetune pooling (`pool`, i.e. mean) and the S4 Text finetune schedule
(constant, warmup 2,000).

Conventions:
- `None` = not stated by any file read (a hydra default whose file is not in the index, or a
  field that does not apply: heads and positions for S4, pooling for pretraining).
- `ffn` is the feed-forward `expand` factor; S4 blocks have no feed-forward sub-block (0).
- `ssm_lr` is the lr of the S4 A and B parameters (`model.layer.lr`; a dict whose `dt: null`
  gives log dt the global lr, or one number for all three).
- `schedule`: constant = `constant_warmup`, cosine = `cosine_warmup` (both linear warmup first),
  plateau = `ReduceLROnPlateau` (no warmup).
- `pooling`: the finetuning decoder's `mode` (`pool` = mean over real positions).
- `positions`: sinusoidal = the `position` encoder of the base Transformer model config
  (state-spaces/s4 `configs/model/transformer.yaml`; the fork's own copy is not in the index);
  rotary = `encoder: null` plus `rotary: true` in the attention layer.
- `window`: the local attention `window_size` (`mhfla`); 0 = full attention.
- `mask_rate`: the released files pass `dataset.mlm_prob` on the command line (README: 0.5 for
  Image) and most set 0.0; the pretrain rows give the file's value where it is not 0 and the
  paper's per-task rate otherwise (`mask_source`).
"""

E = "IdoAmos/not-from-scratch:configs/experiment/"
S4_LAYER = "state-spaces/s4:configs/model/layer/s4.yaml"  # dt_min 1e-3, dt_max 0.1, lr 1e-3
COSINE = "state-spaces/s4:configs/scheduler/cosine_warmup.yaml"  # num_warmup_steps 1000

# Training-split sizes that epochs are counted over (the datasets' releases and the loaders'
# 10% validation splits of CIFAR and Pathfinder; SC35 = speech_commands_v0.02 minus the
# validation_list.txt and testing_list.txt files).
NUM_TRAIN = {"listops": 96_000, "text": 25_000, "retrieval": 147_086, "image": 45_000,
             "pathfinder": 160_000, "pathx": 160_000, "pathx256": 160_000, "scifar": 45_000,
             "speech_commands": 84_843}

FIELDS = ("layers", "width", "heads", "ffn", "positions", "window", "pooling", "norm", "prenorm",
          "lr", "ssm_lr", "schedule", "warmup", "weight_decay", "batch", "epochs", "dropout",
          "dt_min", "dt_max", "mask_rate")


def _row(task, model, stage, source, **fields):
    unknown = set(fields) - set(FIELDS) - {"mask_source"}
    assert not unknown, unknown
    return dict({f: None for f in FIELDS}, task=task, model=model, stage=stage, source=source,
                **fields)


T_LRA = dict(positions="sinusoidal", window=0, norm="layer", prenorm=True, dropout=0.0)

ROWS = [
    # ---------------------------------------------------------------- ListOps
    _row("listops", "transformer", "finetune", E + "lra/transformer-lra-listops.yaml",
         layers=6, width=512, heads=8, ffn=4, pooling="mean", lr=0.05, schedule="constant",
         warmup=2000, weight_decay=0.0, batch=32, epochs=100, **T_LRA),
    _row("listops", "transformer", "pretrain", E + "lra/transformer-lra-listops-mlm.yaml",
         layers=6, width=512, heads=8, ffn=4, lr=0.05, schedule="constant", warmup=2000,
         weight_decay=0.0, batch=32, epochs=100, mask_rate=0.10, mask_source="paper", **T_LRA),
    _row("listops", "s4", "finetune", E + "lra/s4-lra-listops.yaml",
         layers=8, width=128, ffn=0, pooling="mean", norm="batch", prenorm=False, lr=0.01,
         ssm_lr=0.001, schedule="constant", warmup=2000, weight_decay=0.05, batch=50, epochs=40,
         dropout=0.0, dt_min=0.001, dt_max=0.1),
    _row("listops", "s4", "pretrain", E + "lra/s4-lra-listops-mlm.yaml",
         layers=8, width=128, ffn=0, norm="batch", prenorm=False, lr=0.01, ssm_lr=0.001,
         schedule="constant", warmup=2000, weight_decay=0.05, batch=50, epochs=100, dropout=0.0,
         dt_min=0.001, dt_max=0.1, mask_rate=0.10, mask_source="paper"),
    # ---------------------------------------------------------------- Text (IMDB bytes)
    _row("text", "transformer", "finetune", E + "lra/transformer-lra-imdb.yaml",
         layers=6, width=512, heads=8, ffn=4, pooling="mean", lr=0.05, schedule="cosine",
         warmup=2000, weight_decay=0.1, batch=32, epochs=65, **T_LRA),
    _row("text", "transformer", "pretrain", E + "lra/transformer-lra-imdb-mlm.yaml",
         layers=6, width=512, heads=8, ffn=4, lr=0.05, schedule="constant", warmup=5000,
         weight_decay=0.1, batch=32, epochs=32, mask_rate=0.15, mask_source="paper", **T_LRA),
    _row("text", "s4", "finetune", E + "lra/s4-lra-imdb.yaml",
         layers=6, width=256, ffn=0, pooling="mean", norm="batch", prenorm=True, lr=0.01,
         ssm_lr=0.001, schedule="cosine", warmup=5000, weight_decay=0.05, batch=16, epochs=32,
         dropout=0.0, dt_min=0.001, dt_max=0.1),
    _row("text", "s4", "pretrain", E + "lra/s4-lra-imdb-mlm.yaml",
         layers=6, width=256, ffn=0, norm="batch", prenorm=True, lr=0.01, ssm_lr=0.001,
         schedule="constant", warmup=1000, weight_decay=0.05, batch=16, epochs=32, dropout=0.0,
         dt_min=0.001, dt_max=0.1, mask_rate=0.15, mask_source="paper"),
    # ---------------------------------------------------------------- Retrieval (AAN)
    # Pooling: the `aan` pipeline (retrieval decoder) is not in the index.
    _row("retrieval", "transformer", "finetune", E + "lra/transformer-lra-aan.yaml",
         layers=4, width=128, heads=4, ffn=4, lr=0.05, schedule="constant", warmup=5000,
         weight_decay=0.0, batch=32, epochs=32, **T_LRA),
    _row("retrieval", "transformer", "pretrain", E + "lra/transformer-lra-aan-mlm.yaml",
         layers=4, width=128, heads=4, ffn=4, lr=0.05, schedule="constant", warmup=2000,
         weight_decay=0.0, batch=32, epochs=32, mask_rate=0.15, mask_source="paper", **T_LRA),
    _row("retrieval", "s4", "finetune", E + "lra/s4-lra-aan.yaml",
         layers=6, width=256, ffn=0, norm="batch", prenorm=True, lr=0.01, ssm_lr=0.001,
         schedule="constant", warmup=2500, weight_decay=0.05, batch=64, epochs=20, dropout=0.0,
         dt_min=0.001, dt_max=0.1),
    _row("retrieval", "s4", "pretrain", E + "lra/s4-lra-aan-mlm.yaml",
         layers=6, width=256, ffn=0, norm="batch", prenorm=True, lr=0.01, ssm_lr=0.001,
         schedule="constant", warmup=2500, weight_decay=0.05, batch=64, epochs=20, dropout=0.0,
         dt_min=0.001, dt_max=0.1, mask_rate=0.15, mask_source="paper"),
    # ---------------------------------------------------------------- Image (greyscale CIFAR)
    _row("image", "transformer", "finetune", E + "lra/transformer-lra-cifar.yaml",
         layers=3, width=64, heads=4, ffn=2, pooling="mean", lr=0.001, schedule="constant",
         warmup=2000, weight_decay=0.0, batch=50, epochs=200, **T_LRA),
    _row("image", "transformer", "pretrain", E + "lra/transformer-lra-cifar-mlm.yaml",
         layers=3, width=64, heads=4, ffn=2, lr=0.001, schedule="constant", warmup=2500,
         weight_decay=0.0, batch=32, epochs=50, mask_rate=0.5, mask_source="file", **T_LRA),
    _row("image", "s4", "finetune", E + "lra/s4-lra-cifar.yaml + " + COSINE,
         layers=6, width=512, ffn=0, pooling="mean", norm="layer", prenorm=False, lr=0.01,
         ssm_lr=0.001, schedule="cosine", warmup=1000, weight_decay=0.05, batch=50, epochs=200,
         dropout=0.1, dt_min=0.001, dt_max=0.1),
    # Warmup: `constant_warmup`'s default, whose file is not in the index.
    _row("image", "s4", "pretrain", E + "lra/s4-lra-cifar-mlm.yaml",
         layers=6, width=512, ffn=0, norm="layer", prenorm=False, lr=0.01, ssm_lr=0.001,
         schedule="constant", weight_decay=0.05, batch=50, epochs=200, dropout=0.1,
         dt_min=0.001, dt_max=0.1, mask_rate=0.5, mask_source="file"),
    # ---------------------------------------------------------------- Pathfinder (32 x 32)
    _row("pathfinder", "transformer", "finetune", E + "lra/transformer-lra-pathfinder.yaml",
         layers=4, width=128, heads=8, ffn=1, pooling="mean", lr=0.0005, schedule="constant",
         warmup=5000, weight_decay=0.0, batch=32, epochs=200, **T_LRA),
    _row("pathfinder", "transformer", "pretrain",
         E + "lra/transformer-lra-pathfinder-mlm.yaml",
         layers=4, width=128, heads=8, ffn=1, lr=0.0005, schedule="constant", warmup=2500,
         weight_decay=0.0, batch=32, epochs=50, mask_rate=0.5, mask_source="paper", **T_LRA),
    _row("pathfinder", "s4", "finetune", E + "lra/s4-lra-pathfinder.yaml",
         layers=6, width=256, ffn=0, pooling="last", norm="batch", prenorm=True, lr=0.004,
         ssm_lr=0.001, schedule="constant", warmup=2500, weight_decay=0.03, batch=64,
         epochs=200, dropout=0.0, dt_min=0.001, dt_max=0.1),
    _row("pathfinder", "s4", "pretrain", E + "lra/s4-lra-pathfinder-mlm.yaml",
         layers=6, width=256, ffn=0, norm="batch", prenorm=True, lr=0.004, ssm_lr=0.001,
         schedule="constant", warmup=2500, weight_decay=0.03, batch=64, epochs=200,
         dropout=0.0, dt_min=0.001, dt_max=0.1, mask_rate=0.5, mask_source="paper"),
    # ---------------------------------------------------------------- PathX (128 x 128)
    _row("pathx", "transformer", "finetune", E + "lra/transformer-lra-pathx-small.yaml",
         layers=4, width=128, heads=4, ffn=1, positions="sinusoidal", window=4096,
         pooling="max", norm="layer", prenorm=True, lr=0.0005, schedule="constant", warmup=5000,
         weight_decay=0.0, batch=32, epochs=200, dropout=0.0),
    _row("pathx", "transformer", "pretrain", E + "lra/transformer-lra-pathx-mlm-small.yaml",
         layers=4, width=128, heads=4, ffn=1, positions="sinusoidal", window=4096, norm="layer",
         prenorm=True, lr=0.0005, schedule="constant", warmup=5000, weight_decay=0.0, batch=32,
         epochs=200, dropout=0.0, mask_rate=0.5, mask_source="file"),
    # Pooling: the `pathx` pipeline is not in the index.
    _row("pathx", "s4", "finetune", E + "lra/s4-lra-pathx.yaml",
         layers=6, width=256, ffn=0, norm="batch", prenorm=True, lr=0.0005, ssm_lr=0.0005,
         schedule="cosine", warmup=10_000, weight_decay=0.05, batch=16, epochs=50, dropout=0.0,
         dt_min=0.0001, dt_max=0.1),
    _row("pathx", "s4", "pretrain", E + "lra/s4-lra-pathx-mlm.yaml",
         layers=6, width=256, ffn=0, norm="batch", prenorm=True, lr=0.0005, ssm_lr=0.0005,
         schedule="constant", warmup=5000, weight_decay=0.05, batch=32, epochs=50, dropout=0.0,
         dt_min=0.0001, dt_max=0.1, mask_rate=0.5, mask_source="paper"),
    # ---------------------------------------------------------------- PathX-256 (no S4 files)
    _row("pathx256", "transformer", "finetune", E + "lra/transformer-lra-pathx256.yaml",
         layers=4, width=128, heads=4, ffn=4, positions="sinusoidal", window=8192,
         pooling="max", norm="layer", prenorm=True, lr=0.0005, schedule="constant", warmup=5000,
         weight_decay=0.0, batch=32, epochs=200, dropout=0.0),
    _row("pathx256", "transformer", "pretrain", E + "lra/transformer-lra-pathx256-mlm.yaml",
         layers=8, width=128, heads=4, ffn=4, positions="sinusoidal", window=8192, norm="layer",
         prenorm=True, lr=0.0005, schedule="constant", warmup=5000, weight_decay=0.0, batch=32,
         epochs=200, dropout=0.0, mask_rate=0.5, mask_source="file"),
    # ---------------------------------------------------------------- sCIFAR (RGB)
    _row("scifar", "transformer", "finetune", E + "cifar/transformer-cifar.yaml",
         layers=6, width=256, heads=4, ffn=2, positions="rotary", window=0, pooling="mean",
         norm="layer", prenorm=True, lr=0.001, schedule="constant", warmup=2000,
         weight_decay=0.05, batch=50, epochs=200, dropout=0.0),
    _row("scifar", "transformer", "pretrain", E + "cifar/transformer-cifar-lm.yaml",
         layers=6, width=256, heads=4, ffn=2, positions="rotary", window=0, norm="layer",
         prenorm=True, lr=0.001, schedule="constant", warmup=2000, weight_decay=0.05, batch=50,
         epochs=200, dropout=0.0, mask_rate=0.5, mask_source="file"),
    # The fork has no s4-cifar.yaml of its own in the index: its base repository's file.
    _row("scifar", "s4", "finetune",
         "state-spaces/s4:configs/experiment/cifar/s4-cifar.yaml + " + COSINE + " + " + S4_LAYER,
         layers=6, width=512, ffn=0, pooling="mean", norm="layer", prenorm=False, lr=0.01,
         ssm_lr=0.001, schedule="cosine", warmup=1000, weight_decay=0.05, batch=50, epochs=200,
         dropout=0.1, dt_min=0.001, dt_max=0.1),
    _row("scifar", "s4", "pretrain", E + "cifar/s4-cifar-lm.yaml + " + S4_LAYER,
         layers=6, width=512, ffn=0, norm="layer", prenorm=False, lr=0.01, ssm_lr=0.001,
         schedule="constant", warmup=2000, weight_decay=0.05, batch=50, epochs=200, dropout=0.1,
         dt_min=0.001, dt_max=0.1, mask_rate=0.5, mask_source="file"),
    # ---------------------------------------------------------------- Speech Commands (SC35)
    _row("speech_commands", "transformer", "finetune",
         E + "sc/transformer-sc.yaml + IdoAmos/not-from-scratch:configs/pipeline/sc.yaml",
         layers=4, width=128, heads=4, ffn=1, positions="rotary", window=4000, pooling="max",
         norm="layer", prenorm=True, lr=0.001, schedule="plateau", warmup=0, weight_decay=0.05,
         batch=16, epochs=200, dropout=0.0),
    _row("speech_commands", "transformer", "pretrain", E + "sc/transformer-sc-lm.yaml",
         layers=4, width=128, heads=4, ffn=1, positions="rotary", window=4000, norm="layer",
         prenorm=True, lr=0.001, schedule="constant", warmup=2000, weight_decay=0.05, batch=16,
         epochs=200, dropout=0.0, mask_rate=0.25, mask_source="paper"),
    _row("speech_commands", "s4", "finetune",
         E + "sc/s4-sc.yaml + IdoAmos/not-from-scratch:configs/pipeline/sc.yaml + " + COSINE
         + " + " + S4_LAYER,
         layers=6, width=128, ffn=0, pooling="max", norm="batch", prenorm=True, lr=0.01,
         ssm_lr=0.001, schedule="cosine", warmup=1000, weight_decay=0.05, batch=16, epochs=40,
         dropout=0.0, dt_min=0.001, dt_max=0.1),
    _row("speech_commands", "s4", "pretrain",
         E + "sc/s4-sc-lm.yaml + " + COSINE + " + " + S4_LAYER,
         layers=6, width=128, ffn=0, norm="layer", prenorm=True, lr=0.01, ssm_lr=0.001,
         schedule="cosine", warmup=1000, weight_decay=0.05, batch=16, epochs=40, dropout=0.0,
         dt_min=0.001, dt_max=0.1, mask_rate=0.25, mask_source="paper"),
]
