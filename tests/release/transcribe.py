"""Transcribes the authors' released configs into `tests/release/released.json` (run by hand;
the fidelity test only reads the JSON).

    git clone https://github.com/IdoAmos/not-from-scratch R && git -C R checkout f919137
    pip install --target /tmp/hyd hydra-core==1.3.2   # not a dependency of sptlib
    PYTHONPATH=/tmp/hyd python tests/release/transcribe.py R

Each experiment file of `EXPERIMENTS` is composed exactly as the release's `train.py` composes
it (hydra `config.yaml` with `experiment=<file>`, version_base 1.1, the release's `eval`
resolver), interpolations resolved, and flattened to dotted keys (list items by index). Every
value carries the file that set it last in hydra's merge order (`source`): the experiment file
itself or one of the defaults it includes. Only the sections that configure the run are kept
(`SECTIONS`); logging, wandb, callbacks and loader workers are left out.
"""

import json
import os
import subprocess
import sys

import yaml

COMMIT = "f919137"
# release experiment (configs/experiment/<name>.yaml) -> (sptlib task, model, stage)
EXPERIMENTS = {
    "lra/transformer-lra-listops": ("listops", "transformer", "finetune"),
    "lra/transformer-lra-listops-mlm": ("listops", "transformer", "pretrain"),
    "lra/transformer-lra-imdb": ("text", "transformer", "finetune"),
    "lra/transformer-lra-imdb-mlm": ("text", "transformer", "pretrain"),
    "lra/transformer-lra-aan": ("retrieval", "transformer", "finetune"),
    "lra/transformer-lra-aan-mlm": ("retrieval", "transformer", "pretrain"),
    "lra/transformer-lra-cifar": ("image", "transformer", "finetune"),
    "lra/transformer-lra-cifar-mlm": ("image", "transformer", "pretrain"),
    "lra/transformer-lra-pathfinder": ("pathfinder", "transformer", "finetune"),
    "lra/transformer-lra-pathfinder-mlm": ("pathfinder", "transformer", "pretrain"),
    "lra/transformer-lra-pathx-small": ("pathx", "transformer", "finetune"),
    "lra/transformer-lra-pathx-mlm-small": ("pathx", "transformer", "pretrain"),
    "lra/transformer-lra-pathx256": ("pathx256", "transformer", "finetune"),
    "lra/transformer-lra-pathx256-mlm": ("pathx256", "transformer", "pretrain"),
    "lra/s4-lra-listops": ("listops", "s4", "finetune"),
    "lra/s4-lra-listops-mlm": ("listops", "s4", "pretrain"),
    "lra/s4-lra-imdb": ("text", "s4", "finetune"),
    "lra/s4-lra-imdb-mlm": ("text", "s4", "pretrain"),
    "lra/s4-lra-aan": ("retrieval", "s4", "finetune"),
    "lra/s4-lra-aan-mlm": ("retrieval", "s4", "pretrain"),
    "lra/s4-lra-cifar": ("image", "s4", "finetune"),
    "lra/s4-lra-cifar-mlm": ("image", "s4", "pretrain"),
    "lra/s4-lra-pathfinder": ("pathfinder", "s4", "finetune"),
    "lra/s4-lra-pathfinder-mlm": ("pathfinder", "s4", "pretrain"),
    "lra/s4-lra-pathx": ("pathx", "s4", "finetune"),
    "lra/s4-lra-pathx-mlm": ("pathx", "s4", "pretrain"),
    "lra/dlr-lra-listops": ("listops", "dlr", "finetune"),
    "lra/dlr-lra-listops-mlm": ("listops", "dlr", "pretrain"),
    "lra/dlr-lra-imdb": ("text", "dlr", "finetune"),
    "lra/dlr-lra-imdb-mlm": ("text", "dlr", "pretrain"),
    "lra/dlr-lra-cifar": ("image", "dlr", "finetune"),
    "lra/dlr-lra-cifar-mlm": ("image", "dlr", "pretrain"),
    "lra/dlr-lra-pathx": ("pathx", "dlr", "finetune"),
    "lra/dlr-lra-pathx-mlm": ("pathx", "dlr", "pretrain"),
    "lra/s4d-lra-cifar": ("image", "s4d", "finetune"),
    "lra/s4d-lra-pathx-small": ("pathx", "s4d", "finetune"),
    "lra/dss-pathfinder-lm": ("pathx", "dss", "pretrain"),
    "cifar/transformer-cifar": ("scifar", "transformer", "finetune"),
    "cifar/transformer-cifar-lm": ("scifar", "transformer", "pretrain"),
    "cifar/s4-cifar": ("scifar", "s4", "finetune"),
    "cifar/s4-cifar-lm": ("scifar", "s4", "pretrain"),
    "sc/transformer-sc": ("speech_commands", "transformer", "finetune"),
    "sc/transformer-sc-lm": ("speech_commands", "transformer", "pretrain"),
    "sc/s4-sc": ("speech_commands", "s4", "finetune"),
    "sc/s4-sc-lm": ("speech_commands", "s4", "pretrain"),
}
# Released experiments with no sptlib counterpart (docs/reproducing.md says why).
UNMATCHED = ("lra/s4-lra-pathx-small", "lra/transformer-local-lra-pathfinder-mlm-small",
             "lra/s4-lra-pathseg-mlm")
# What the release's code does that no config states (key -> value, source).
CODE_FIELDS = {
    "code.dense_init": ("torch", "PyTorch's defaults: nn.Linear (src/models/sequence/ff.py, "
                                 "the S4 block's output_linear, the encoders and decoders), "
                                 "nn.MultiheadAttention (src/models/sequence/mha.py); the "
                                 "release never re-initialises them (`initializer: null`)"),
}
# Code facts that hold for some records only: (key, value, source, condition on the fields).
CONDITIONAL_CODE_FIELDS = (
    ("code.s4d_discretization", "bilinear",
     "SSKernelDiag(disc='bilinear') default, src/models/sequence/ss/kernel.py (no config sets it)",
     lambda f: f.get("model.layer.mode", {}).get("value") == "diag"),
    ("code.decoder_hidden_activation", "relu",
     "NoneLinearSequenceDecoder(type='mlp'): Linear(d, d) -> ReLU -> Linear, "
     "src/tasks/decoders.py",
     lambda f: f.get("decoder._name_", {}).get("value") == "sequence_nonelinear"),
    ("code.position_table", "interleaved sin/cos",
     "PositionalEncoder: pe[:, 0::2] = sin, pe[:, 1::2] = cos, src/tasks/encoders.py",
     lambda f: f.get("model.encoder._name_", {}).get("value") == "position"),
    ("code.embedding_init", "normal(0, 1)",
     "nn.Embedding's default init (the `embedding` encoder, src/tasks/encoders.py)",
     lambda f: f.get("encoder", {}).get("value") == "embedding"),
    ("trainer.val_check_interval", 1.0,
     "PyTorch Lightning Trainer default (validation once per epoch; configs/trainer/default.yaml "
     "does not set it)",
     lambda f: "trainer.val_check_interval" not in f),
)
SECTIONS = ("model", "optimizer", "scheduler", "loader", "trainer", "dataset", "encoder",
            "decoder", "task")
DROP = ("loader.num_workers", "loader.pin_memory", "trainer.gpus", "trainer.log_every_n_steps",
        "trainer.weights_summary", "trainer.progress_bar_refresh_rate",
        "trainer.track_grad_norm", "trainer.limit_train_batches", "trainer.limit_val_batches",
        "model.track_norms", "model.layer.verbose", "dataset.n_workers", "task.torchmetrics",
        "task.metrics", "trainer.save_val_outputs")


def flatten(value, prefix=""):
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}.{i}"))
        return out
    return {prefix: value}


def _place(tree, package):
    for part in reversed([p for p in package.split(".") if p]):
        tree = {part: tree}
    return tree


def provenance(config_loader, experiment, configs_dir):
    """dotted key -> the config file that set it last (hydra's merge order)."""
    from hydra.types import RunMode
    dl = config_loader.compute_defaults_list("config", [f"experiment={experiment}"], RunMode.RUN)
    source = {}
    for d in dl.defaults:
        if d.config_path is None or d.config_path.startswith("hydra/"):
            continue
        with open(os.path.join(configs_dir, d.config_path + ".yaml")) as f:
            body = yaml.safe_load(f) or {}
        if isinstance(body, dict):
            body.pop("defaults", None)
        for key in flatten(_place(body, d.package or "")):
            for k in list(source):  # a file that sets a list or dict replaces its items
                if k.startswith(key + "."):
                    del source[k]
            source[key] = f"configs/{d.config_path}.yaml"
    return source


def resolve_each(cfg, keys):
    from omegaconf import OmegaConf
    out = {}
    for key in keys:
        try:
            v = OmegaConf.select(cfg, key, throw_on_missing=False)
            v = OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
        except Exception as e:  # noqa: BLE001 -- an interpolation the release never resolves
            raw = OmegaConf.to_container(cfg, resolve=False)
            for part in key.split("."):
                raw = raw[int(part)] if isinstance(raw, list) else raw[part]
            v = {"unresolved": str(raw), "error": type(e).__name__}
        out[key] = v
    return out


def own_values(configs_dir, experiment, task, model, stage, error):
    """An experiment hydra cannot compose: the values its own file states (uninterpolated)."""
    with open(os.path.join(configs_dir, "experiment", experiment + ".yaml")) as f:
        body = yaml.safe_load(f)
    body.pop("defaults", None)
    flat = flatten({k: body[k] for k in SECTIONS if k in body})
    src = f"configs/experiment/{experiment}.yaml"
    return dict(experiment=src, task=task, model=model, stage=stage,
                compose_error=f"{type(error).__name__}: {str(error).splitlines()[0]}",
                fields={k: {"value": v, "source": src} for k, v in flat.items()
                        if k not in DROP})


def main(repo):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf
    OmegaConf.register_new_resolver("eval", eval)
    commit = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    assert commit.startswith(COMMIT), commit
    configs_dir = os.path.join(os.path.abspath(repo), "configs")
    records = []
    with initialize_config_dir(config_dir=configs_dir, version_base="1.1"):
        loader = GlobalHydra.instance().config_loader()
        for experiment, (task, model, stage) in EXPERIMENTS.items():
            try:
                cfg = compose(config_name="config", overrides=[f"experiment={experiment}"])
            except Exception as e:  # noqa: BLE001 -- e.g. a model config the release lacks
                records.append(own_values(configs_dir, experiment, task, model, stage, e))
                continue
            raw = OmegaConf.to_container(cfg, resolve=False)
            flat = flatten({k: raw.get(k) for k in SECTIONS if k in raw})
            keys = [k for k in flat if k not in DROP and not k.split(".")[-1].startswith("__")]
            values = resolve_each(cfg, keys)
            src = provenance(loader, experiment, configs_dir)
            fields = {}
            for k in keys:
                origin = src.get(k) or next((s for p, s in src.items() if k.startswith(p + ".")),
                                            None)
                fields[k] = {"value": values[k], "source": origin or "(interpolation)"}
            fields.update({k: {"value": v, "source": s} for k, (v, s) in CODE_FIELDS.items()})
            for k, v, s, cond in CONDITIONAL_CODE_FIELDS:
                if cond(fields):
                    fields[k] = {"value": v, "source": s}
            records.append(dict(experiment=f"configs/experiment/{experiment}.yaml", task=task,
                                model=model, stage=stage, fields=fields))
    out = dict(repository="IdoAmos/not-from-scratch", commit=commit, unmatched=list(UNMATCHED),
               records=records)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "released.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=False)
        f.write("\n")
    print(f"{len(records)} experiments, {sum(len(r['fields']) for r in records)} values -> {path}")


if __name__ == "__main__":
    main(sys.argv[1])
