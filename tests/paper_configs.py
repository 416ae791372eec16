"""The authors' released configs (`tests/release/released.json`, composed by
`tests/release/transcribe.py` from IdoAmos/not-from-scratch at f919137) and sptlib's presets seen
in the release's terms: `sptlib_value(config, record, key)` is what the preset does for the
release key `key` (a dotted hydra key, e.g. `model.layer.n_ssm`), in the release's vocabulary.

`tests/test_config_fidelity.py` compares the two for every key of every record, but the keys of
`NOT_COMPARED` (each with its reason). Release values are read as the release's code reads them
(`release_value`): `n_ssm: null` is one copy per channel (`SSKernel`: `n_ssm = H`), `lr.dt: null`
the global lr (`OptimModule.register`: no `lr` in `_optim`, weight decay 0). DLR's
`lr.Lambda_re: null` is read per layer (`DLRKernel.__init__` in src/models/sequence/ss/dss.py):
the first layer copies the `lr` node (`self.lr.update(lr)`), writes `lr.Lambda_re = lr.Lambda`
into the shared node, not its copy, and registers the real part of Λ (`Lambda_log_neg_re`) with
its copy's None, i.e. at the global lr with weight decay 0; every later layer is built from the
written node (`layers = layer * n_layers`, src/models/sequence/model.py) and trains it at
`lr.Lambda`. sptlib gives every layer `lr.Lambda` (a documented
deviation, docs/reproducing.md).
"""

import fnmatch
import json
import os

RELEASE = json.load(open(os.path.join(os.path.dirname(__file__), "release", "released.json")))
RECORDS = RELEASE["records"]

# Training-split sizes that epochs are counted over (the datasets' releases and the loaders'
# 10% validation splits of CIFAR and Pathfinder; SC35 = speech_commands_v0.02 minus the
# validation_list.txt and testing_list.txt files).
NUM_TRAIN = {"listops": 96_000, "text": 25_000, "retrieval": 147_086, "image": 45_000,
             "pathfinder": 160_000, "pathx": 160_000, "pathx256": 160_000, "scifar": 45_000,
             "speech_commands": 84_843}
DEFAULT_LENGTH = {"listops": 2000, "text": 4096, "retrieval": 4000}

# Release keys not compared, with the reason (glob patterns over the dotted key).
NOT_COMPARED = {
    "dataset._name_": "the loader's registry name; the task itself is the record's `task`",
    "dataset.seed": "seed of the loaders' train/validation split (sptlib.data splits by its own)",
    "dataset.val_split": "split sizes: checked through the training-split sizes (NUM_TRAIN) "
                         "that every epoch count is converted with",
    "dataset.test_split": "as dataset.val_split",
    "dataset.tokenize": "tokenisation: sptlib.data (tests/test_data_*.py)",
    "dataset.level": "tokenisation (byte level): sptlib.data",
    "dataset.min_freq": "vocabulary construction: sptlib.data",
    "dataset.max_vocab": "vocabulary construction: sptlib.data (the vocabulary comes from the data)",
    "dataset.append_bos": "tokenisation: sptlib.data",
    "dataset.append_eos": "tokenisation: sptlib.data",
    "dataset.append_cls": "tokenisation: sptlib.data",
    "model.layer.l_max": "kernel length: both compute the SSM kernel at the input's length",
    "model.layer.pykeops": "implementation of the Cauchy / Vandermonde sums (same values)",
    "model.layer.lr.dt_min": "nested under `lr` where the DLR code never reads it (the DSS/DLR "
                             "`lr` dict has only log_dt, Lambda, Lambda_re, W)",
    "model.layer.lr.dt_max": "as model.layer.lr.dt_min",
    "dataset.span_length": "unused while dataset.span_masking is false (every record)",
}


def not_compared(key):
    for pattern, reason in NOT_COMPARED.items():
        if fnmatch.fnmatchcase(key, pattern):
            return reason
    return None


def release_value(record, key):
    """The release's value of `key` as its code uses it (see the module docstring)."""
    fields = record["fields"]
    v = fields[key]["value"]
    d_model = fields["model.d_model"]["value"]
    if key == "model.layer.n_ssm" and v is None:
        return d_model
    if key == "model.layer.lr.dt" and v is None:
        return fields["optimizer.lr"]["value"]
    if key == "model.layer.lr.Lambda_re" and v is None:
        return (f"layer 1: {fields['optimizer.lr']['value']:g} (the global lr, weight decay 0); "
                f"layers 2-{fields['model.n_layers']['value']}: "
                f"{fields['model.layer.lr.Lambda']['value']:g}")
    return v


def _gelu(approximate):
    return "gelu_tanh" if approximate else "gelu"


def _schedule_name(o):
    return {"constant": "constant_warmup", "cosine": "cosine_warmup"}[o.schedule]


def sptlib_value(config, record, key):
    """What the preset `config` does for release key `key` of `record` (KeyError: no view)."""
    task, stage_name = record["task"], record["stage"]
    m, s = config.model, config.stages[stage_name]
    o, obj = s.optim, s.objective
    pretrain = stage_name == "pretrain"
    family = m.mixer
    attention = family == "attention"
    mix = m[family] if not attention else {}
    causal = bool(s.get("causal", m.causal))
    num_train = NUM_TRAIN[task]
    ssm_lr = o.ssm_lr
    dt_lr = ssm_lr if o.get("ssm_dt_lr") is None else o.ssm_dt_lr
    head = ("retrieval" if (not pretrain and obj.kind == "retrieval") else
            "sequence_nonelinear" if (not pretrain and m.head_hidden) else "sequence")
    values = {
        "model._name_": "model",
        "model.n_layers": m.n_layers, "model.d_model": m.d_model, "model.norm": m.norm,
        "model.prenorm": m.prenorm, "model.dropout": m.dropout,
        "model.tie_dropout": m.tie_dropout,
        "model.residual": "R",  # x + f(x) residual branches (sptlib.layers.blocks)
        "model.transposed": False,  # activations [batch, length, features]
        "model.pool._name_": "pool", "model.pool.stride": 1, "model.pool.expand": None,
        "model.decoder": None,
        "model.encoder": None if m.positions == "none" else m.positions,
        "model.encoder._name_": "position" if m.positions == "sinusoidal" else m.positions,
        "model.encoder.dropout": m.dropout,
        "encoder": "embedding" if m.encoder == "token" else "linear",
        "optimizer._name_": "adamw",
        "optimizer.betas": [o.b1, o.b2],
        "optimizer.lr": o.lr, "optimizer.weight_decay": o.weight_decay,
        "scheduler._name_": _schedule_name(o),
        "scheduler.num_warmup_steps": o.warmup_steps,
        "scheduler.num_training_steps": (o.get("decay_steps", 0) or s.num_steps)
        if o.schedule == "cosine" else None,
        # ReduceLROnPlateau's options: sptlib has no plateau schedule
        "scheduler.mode": None, "scheduler.factor": None, "scheduler.patience": None,
        "scheduler.min_lr": None,
        "loader.batch_size": s.batch_size,
        "loader.drop_last": True,  # sptlib.data.pipeline: drop_remainder=True for training
        "loader.train_resolution": 1, "loader.eval_resolutions": 1,
        "trainer.max_epochs": s.num_steps * s.batch_size / num_train,
        "trainer.accumulate_grad_batches": 1,
        "trainer.gradient_clip_val": o.grad_clip,
        "trainer.val_check_interval": s.eval_every * s.batch_size / num_train,
        "task._name_": "base",
        "task.loss": ("masked_mae" if obj.target == "l1" else "cross_entropy") if pretrain
        else "cross_entropy",
        "decoder._name_": head,
        # Pretraining heads are per position: the release's SequenceDecoder with l_output=None
        # and mode `last` keeps the last L positions, i.e. all of them.
        "decoder.mode": "last" if pretrain else {"mean": "pool"}.get(m.pooling, m.pooling),
        "decoder.use_lengths": not pretrain,  # sptlib pools over real positions only
        "decoder.nli": True,  # RetrievalHead: MLP([u, v, u*v, u-v])
        "decoder.activation": _gelu(m.gelu_approximate),
        "decoder.d_model": None,  # RetrievalHead: hidden width = the feature width
        # data
        "dataset.l_max": config.data.max_length or DEFAULT_LENGTH.get(task),
        "dataset.mlm_prob": (obj.mask_rate if obj.kind == "masked" else 0.0) if pretrain
        else None,
        "dataset.causal_lm": obj.kind == "causal",
        "dataset.lm_loss": "l1" if obj.target == "l1" else "ce",
        "dataset.ignore_val": True,  # the masked loss counts masked positions only
        "dataset.span_masking": obj.span_length > 1,
        "dataset.nesting_lvl": False,
        "dataset.sequential": True,
        "dataset.resolution": config.data.get("resolution"),
        "dataset.grayscale": task == "image",  # image: greyscale CIFAR; scifar: RGB
        "dataset.permute": None, "dataset.augment": False, "dataset.cutout": False,
        "dataset.random_erasing": False,
        "dataset.mfcc": False, "dataset.length": 16000, "dataset.all_classes": True,
        "dataset.dropped_rate": 0.0, "dataset.pool": 1,
        "code.dense_init": m.init_scheme,
        "code.decoder_hidden_activation": m.head_activation if m.head_hidden else None,
        "code.embedding_init": "normal(0, 1)",
        "code.position_table": "sin | cos halves",  # sptlib.models.encoders  # TokenEncoder: nn.initializers.normal(1.0)
        "code.s4d_discretization": mix.get("discretization", "zoh"),
    }
    if attention:
        a = m.attention
        values.update({
            "model.layer.0._name_": "mhfla" if a.window else "mhfa",
            "model.layer.0.causal": causal, "model.layer.0.n_heads": a.n_heads,
            "model.layer.0.dropout": None, "model.layer.0.bias": True,
            "model.layer.0.add_bias_kv": False, "model.layer.0.add_zero_attn": False,
            "model.layer.0.kdim": None, "model.layer.0.vdim": None,
            "model.layer.0.rotary": a.positions == "rotary",
            "model.layer.0.window_size": a.window,
            # sptlib's band |i - j| <= window: no blocks to look at
            "model.layer.0.look_backward": "band", "model.layer.0.look_forward": "band",
            "model.layer.1._name_": "ff", "model.layer.1.expand": m.ffn_mult,
            "model.layer.1.activation": _gelu(m.gelu_approximate),
            "model.layer.1.dropout": m.dropout,
        })
    else:
        values.update({
            "model.layer._name_": {"s4": "s4", "s4d": "s4", "dlr": "dlr", "dss": "dss"}[family],
            "model.layer.d_state": mix.d_state, "model.layer.channels": 1,
            "model.layer.bidirectional": not causal,
            "model.layer.activation": _gelu(mix.get("gelu_approximate", True)),
            "model.layer.postact": "glu", "model.layer.initializer": None,
            "model.layer.weight_norm": False, "model.layer.hyper_act": None,
            "model.layer.gate": None, "model.layer.bottleneck": None,
            "model.layer.deterministic": False, "model.layer.rank": 1,
            "model.layer.tie_dropout": mix.get("tie_dropout", False),
            "model.layer.mode": "diag" if family == "s4d" else "nplr",
            "model.layer.measure": f"diag-{mix.get('init_kind')}" if family == "s4d" else "legs",
            "model.layer.dt_min": mix.get("dt_min", 1e-3),
            "model.layer.dt_max": mix.get("dt_max", 1e-1),
            "model.layer.lr": ssm_lr if dt_lr == ssm_lr else "per-parameter",
            "model.layer.lr.dt": dt_lr, "model.layer.lr.A": ssm_lr, "model.layer.lr.B": ssm_lr,
            "model.layer.n_ssm": mix.get("n_ssm", 0) or m.d_model,
            "model.layer.dropout": m.dropout,
        })
        if family == "dss":  # DSS: Lambda in the SSM group, its output matrix W in the default
            values.update({"model.layer.lr.Lambda": ssm_lr, "model.layer.lr.W": o.lr,
                           "model.layer.max_kernel_length": None})
        if family == "dlr":
            in_ssm = mix.get("c_in_ssm_group", False)
            omega = mix.get("theta_init", "uniform") == "omega"
            values.update({
                # theta_init=uniform draws a^2 in [1e-4, 1e-1]: the release's a^2 = dt / 2
                # for dt in [2e-4, 2e-1]
                "model.layer.dt_min": mix.get("dt_min", 1e-3) if omega else 2e-4,
                "model.layer.dt_max": mix.get("dt_max", 1e-1) if omega else 2e-1,
                "model.layer.lr.Lambda": ssm_lr, "model.layer.lr.Lambda_re": ssm_lr,
                "model.layer.lr.W": ssm_lr if in_ssm else o.lr,
                "model.layer.wd": 0 if in_ssm else o.weight_decay,
                "model.layer.trainable.Lambda": True, "model.layer.trainable.W": True,
                "model.layer.Lambda_init": "omega" if omega else "uniform",
                # W_scale null = 1/N per real component; `uniform`: 1/sqrt(2N)
                "model.layer.W_scale": None if omega else "1/sqrt(2N)",
                "model.layer.kernel_type": "dlr", "model.layer.kernel_to_real": "real",
                "model.layer.version": "", "model.layer.attn_ff": 0,
                "model.layer.chunk_size": None, "model.layer.max_kernel_length": None,
            })
    return values[key]
