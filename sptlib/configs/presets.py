"""The paper-size configs: `build(task, model, regime)`, the regimes, the compare section.

Every paper-size file in `experiments/` is a thin `get_config(arg)` over `build(task, model,
regime, ...)`, so one table (`sptlib.configs.paper.TASKS`) holds the paper's sizes, mask rates,
optimiser settings and target TPU slices, and hundreds of task × model × regime combinations need
no copies. Argument strings: `sptlib.configs.common`.

Regimes (stage_order of the resulting config):
  scratch                ("scratch",): classification from random init, `finetune_steps` steps;
  scratch-equal-compute  ("scratch",): the same for pretrain + finetune steps;
  spt-masked             ("pretrain", "finetune"): masked denoising (task mask rate), then
                         classification from the best pretrain checkpoint, head re-initialised;
  spt-causal             ("pretrain", "finetune"): next-token prediction on a causal backbone;
  mlpinit                ("mlpinit", "finetune"): the model with its sequence mixers bypassed
                         (per-token) for `pretrain_steps` steps on the task's labels (or masked,
                         `mlpinit_objective`), then finetuning with fresh mixers and every other
                         tensor loaded (`sptlib.configs.variants`).
The finetune stage of an SPT or mlpinit regime has exactly the scratch stage's budget and
optimiser; the pretrain stage has the released pretraining config's (`Recipe.pretrain`).
Model names may carry a variant (transformer-deep, transformer-wide, transformer-wide<k>) or name
the bag-of-words control `bow` (`sptlib.configs.variants`).
"""

from __future__ import annotations

import math

import ml_collections

from sptlib.slices import meshes
from sptlib.configs import variants
from sptlib.configs.paper import REGIMES, TASKS, Recipe, TaskSpec
from sptlib.train import config as train_config

MODELS = ("transformer", "transformer-causal", "s4", "s4d", "dss", "gss", "gss-hybrid", "dlr",
          "s5", "mamba", "mamba2")
# Selective SSMs (sptlib.layers.mamba): the SSM recipe's sizes, no FFN (their reference blocks
# have none), and one learning rate (their reference code: A_log, D and the dt bias only skip
# weight decay).
SELECTIVE_MODELS = ("mamba", "mamba2")
# Names beside MODELS: Transformer width/depth variants and the bag-of-words control.
VARIANTS = ("transformer-deep", "transformer-wide2", "transformer-wide", "bow")


def randinit_overrides(model: str) -> dict | None:
    """Model overrides of the random-SSM-init variant (`<model>-randinit`: the unstructured
    control of the paper's structured-vs-random ablation, `layers.ssm.random_diagonal_inits`), or
    None when the zoo has no random initialiser for that model (S4D, DSS and S5 have one)."""
    base = model.removesuffix("-randinit")
    if base not in ("s4d", "dss", "s5"):
        return None
    return {f"{base}.init_kind": "random"}


def has_randinit(model: str) -> bool:
    return randinit_overrides(model) is not None


# The SSM blocks of the zoo (sptlib.layers.ssm_block.SSMBlock) and the recipe options each takes.
SSM_BLOCKS = ("s4", "s4d", "dss", "dlr", "s5")
MIXER_OPTIONS = {"n_ssm": ("s4", "s4d"), "init_kind": ("s4d",), "discretization": ("s4d",),
                 "c_in_ssm_group": ("dlr",), "theta_init": ("dlr",)}


def recipe_for(task: TaskSpec, model: str) -> Recipe:
    """The recipe of `model` on `task`: its own (`TaskSpec.models`: DLR, S4D, DSS where the
    release has their files), else the Transformer's or the shared SSM one."""
    own = task.models.get(variants.family(model))
    if own is not None:
        return own
    return task.ssm if variants.uses_ssm_lr(model) else task.transformer


def steps_for(recipe: Recipe, num_train: int) -> int:
    return max(1, int(round(recipe.epochs * num_train / recipe.batch_size)))


def set_model(model_cfg, name: str, task: TaskSpec, recipe: Recipe) -> None:
    """Fills `config.model` for model `name` with `recipe`'s sizes (in place).

    A recipe with a `window` gets the local attention kernel (O(L · window) time and memory; a
    window over `impl="plain"` would only mask a full L × L score matrix). The local builders
    (`sptlib.configs.cpu_sized`) share it; the paper code's initialisation and GELU are
    `set_paper_code`'s, for the paper presets only.
    """
    base = variants.family(name)
    m = model_cfg
    m.n_layers, m.d_model = recipe.n_layers, recipe.d_model
    m.norm, m.prenorm, m.dropout = recipe.norm, recipe.prenorm, recipe.dropout
    m.ffn_mult, m.pooling = recipe.ffn_mult, recipe.pooling
    m.remat = recipe.remat
    m.tie_dropout = recipe.tie_dropout
    m.head_hidden, m.head_activation = recipe.head_hidden, recipe.head_activation
    m.causal = base == "transformer-causal"
    m.attention.n_heads = recipe.n_heads
    m.attention.window = recipe.window
    m.attention.impl = "local" if recipe.window else "plain"
    if task.data["input_type"] == "continuous":
        m.encoder, m.d_input, m.mask_channel = "linear", task.d_input, True
    else:
        m.encoder = "token"
    if base == "bow":
        variants.set_bow(m)
    elif base in ("transformer", "transformer-causal"):
        m.mixer, m.pattern = "attention", "uniform"
        if recipe.positions not in ("sinusoidal", "rotary"):
            raise ValueError(f"Recipe.positions must be sinusoidal | rotary, got "
                             f"{recipe.positions!r}")
        # Rotary positions live in the attention layer; sinusoidal ones are added by the encoder.
        rotary = recipe.positions == "rotary"
        m.positions = "none" if rotary else "sinusoidal"
        m.attention.positions = "rotary" if rotary else "none"
    elif base == "gss":
        m.mixer, m.pattern, m.ffn_mult = "gss", "uniform", 0
    elif base == "gss-hybrid":
        m.mixer, m.pattern, m.ffn_mult = "gss", "gss_hybrid", 0
    elif base in SELECTIVE_MODELS:
        m.mixer, m.pattern, m.ffn_mult = base, "uniform", 0
    elif base in SSM_BLOCKS:
        m.mixer, m.pattern = base, "uniform"
        # DLR's step size only sets its decay rates' init range (with theta_init=omega).
        for key in ("dt_min", "dt_max"):
            if getattr(recipe, key) is not None:
                m[base][key] = getattr(recipe, key)
        if recipe.tie_dropout:
            m[base].tie_dropout = True
        for key, value in recipe.mixer.items():
            if base in MIXER_OPTIONS[key]:
                m[base][key] = value
    else:
        raise ValueError(f"Unknown model {name!r}; known: {MODELS + VARIANTS} (+ '-randinit' "
                         "variants)")
    variants.apply_variant(m, name)
    for k, v in (randinit_overrides(name) or {}).items() if name.endswith("-randinit") else ():
        sub, field = k.split(".")
        m[sub][field] = v


def set_paper_code(model_cfg) -> None:
    """What the paper's PyTorch code does that its configs do not state (in place): PyTorch's
    initialisation of every dense layer (`init_scheme="torch"`, the SSM blocks' output
    projections too) and exact GELU (FFN, SSM blocks, retrieval head)."""
    m = model_cfg
    m.init_scheme, m.gelu_approximate = "torch", False
    if m.mixer in SSM_BLOCKS:
        m[m.mixer].init_scheme, m[m.mixer].gelu_approximate = "torch", False


def set_optim(stage, recipe: Recipe, ssm: bool) -> None:
    o = stage.optim
    o.lr, o.weight_decay = recipe.lr, recipe.weight_decay
    o.warmup_steps, o.schedule = recipe.warmup_steps, recipe.schedule
    o.decay_steps = recipe.decay_steps
    o.ssm_lr = recipe.ssm_lr if ssm else recipe.lr
    o.ssm_dt_lr = (recipe.lr if recipe.dt_lr == "lr" else recipe.dt_lr) if ssm else None
    o.ssm_weight_decay = 0.0


def apply_regime(config, regime: str, *, task: TaskSpec, pretrain_steps: int,
                 finetune_steps: int, pretrain_batch_ratio: float = 1.0,
                 mlpinit_objective: str = "classify", target: str = "") -> None:
    """Sets stage_order and step budgets of `config` for `regime` (in place).

    `target`: the masked-SPT target where the recipe's pretraining sets its own (default: the
    task's). Causal SPT pretrains a causal backbone and finetunes it bidirectionally, as the
    paper's code (the causal mask is a pretraining choice): `stages.pretrain.causal = True`,
    `stages.finetune.causal = False` (a stage's `causal` overrides `model.causal`).

    `pretrain_batch_ratio` (pretrain batch / finetune batch) converts the pretraining steps into
    finetune-batch steps for `scratch-equal-compute`, so the control sees as many examples.
    `mlpinit_objective`: stage 1 of `mlpinit`, classify (the task's labels; default) | masked.
    """
    if regime not in REGIMES:
        raise ValueError(f"Unknown regime {regime!r}; known: {REGIMES}")
    st = config.stages
    st.finetune.num_steps = finetune_steps
    st.scratch.num_steps = finetune_steps
    st.pretrain.num_steps = pretrain_steps
    if regime == "scratch":
        config.stage_order = ("scratch",)
    elif regime == "scratch-equal-compute":
        config.stage_order = ("scratch",)
        st.scratch.num_steps = int(round(pretrain_steps * pretrain_batch_ratio)) + finetune_steps
    elif regime == "mlpinit":
        variants.add_mlpinit(config, task=task, steps=pretrain_steps, objective=mlpinit_objective)
    else:
        config.stage_order = ("pretrain", "finetune")
        obj = st.pretrain.objective
        if regime == "spt-masked":
            obj.kind = "masked"
            obj.mask_rate = task.mask_rate
        else:
            obj.kind = "causal"
            config.model.causal = True
            st.pretrain.causal, st.finetune.causal = True, False
        if target or task.target:
            obj.target = target or task.target
    for name in ("finetune", "scratch"):
        st[name].objective.kind = task.objective


def build(task_name: str, model: str = "s4d", regime: str = "spt-masked", *,
          scale: float = 1.0, mlpinit_objective: str = "classify") -> ml_collections.ConfigDict:
    """The paper's config for `task_name` × `model` × `regime` (locked).

    Args:
      task_name: a key of TASKS.
      model: one of MODELS or VARIANTS (or `<ssm>-randinit`).
      regime: one of REGIMES.
      scale: multiplies every stage's number of steps (e.g. 0.1 for a quick look).
      mlpinit_objective: stage 1 of the mlpinit regime: classify | masked.
    """
    if task_name not in TASKS:
        raise ValueError(f"Unknown task {task_name!r}; known: {sorted(TASKS)}")
    task = TASKS[task_name]
    attention = not variants.uses_ssm_lr(model)
    recipe = recipe_for(task, model)
    c = train_config.base_config()
    with c.unlocked():
        c.data.update(task.data)
        set_model(c.model, model, task, recipe)
        set_paper_code(c.model)
        if variants.family(model) == "gss-hybrid":
            c.model.attention.n_heads = task.transformer.n_heads
        steps = {}
        for name in ("pretrain", "finetune", "scratch"):
            s, r = c.stages[name], recipe.stage(name)
            s.batch_size = r.batch_size
            set_optim(s, r, ssm=not attention and variants.family(model) not in SELECTIVE_MODELS)
            steps[name] = steps_for(r, task.num_train)
        scaled = {k: max(1, int(v * scale)) for k, v in steps.items()}
        for name in ("pretrain", "finetune", "scratch"):
            # Validate (and keep the best checkpoint) once per epoch, as the paper's code (PyTorch
            # Lightning's default; every half epoch in the continuous pretraining pipelines).
            epochs = task.pretrain_eval_epochs if name == "pretrain" else 1.0
            every = round(epochs * task.num_train / recipe.stage(name).batch_size)
            c.stages[name].eval_every = c.stages[name].checkpoint_every = max(
                1, min(every, scaled[name]))
        apply_regime(c, regime, task=task, pretrain_steps=scaled["pretrain"],
                     finetune_steps=scaled["finetune"],
                     pretrain_batch_ratio=recipe.stage("pretrain").batch_size / recipe.batch_size,
                     mlpinit_objective=mlpinit_objective,
                     target=recipe.stage("pretrain").target)
        set_slice(c, recipe.slice or task.slice, [recipe.stage(n).batch_size for n in ("pretrain", "finetune")])
        add_compare(c, models=("transformer", "s4"), regimes=("scratch", "spt-masked"),
                    seeds=(0, 1, 2), title=f"{task_name}: {model}, paper sizes")
    c.lock()
    return c


def set_slice(config, slice_name: str, batch_sizes) -> None:
    """Names the TPU slice `config` is sized for and its mesh there (config unlocked).

    Data parallelism over every chip unless a stage's global batch does not divide by the chip
    count (the released batch of 50 on a 4-chip v4-8): then the batch is split over the largest
    divisor of both and the remaining factor goes to the `tensor` axis on the slice
    (`config.aot.tensor`, see `meshes.slice_mesh`). The local `config.mesh` stays all-data, so
    the preset also runs on one CPU or GPU unchanged.
    """
    devices = meshes.expected_device_count(slice_name)
    data = math.gcd(devices, *[int(b) for b in batch_sizes])
    config.aot.slice = slice_name
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = -1, 1, 1
    config.aot.tensor = devices // data if devices // data > 1 else 0


def add_compare(config, *, models, regimes, seeds, data_fractions=(1.0,), length_factors=(),
                title="") -> None:
    """Adds (or replaces) the `compare` section that `sptlib.protocol.compare` expands (config unlocked)."""
    comp = ml_collections.ConfigDict()
    # Model names (MODELS) compared, each with its own paper recipe.
    comp.models = tuple(models)
    # Regimes (REGIMES) every model runs under.
    comp.regimes = tuple(regimes)
    # Training seeds (config.seed); data files and nested subsets do not depend on them.
    comp.seeds = tuple(int(s) for s in seeds)
    # Fractions of the training split (nested subsets, config.data.data_fraction).
    comp.data_fractions = tuple(float(f) for f in data_fractions)
    # Evaluate finished classifiers at these multiples of the training length (empty = off).
    comp.length_factors = tuple(float(f) for f in length_factors)
    # Title of comparison.md.
    comp.title = title
    config.compare = comp
