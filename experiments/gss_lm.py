r"""Gated State Spaces language modelling (Mehta, Gupta, Cutkosky & Neyshabur, ICLR 2023):
train at one length, evaluate zero-shot at up to 16x, compare at equal parameters and compute.

CPU default (no argument): the offline code corpus (`task='code_lm'`: the Python source of the
installed sptlib dependencies, ~4 MB of bytes, file-level 90/5/5 split; sptlib/data/lm.py), byte
tokens, GSS, GSS-Hybrid, DSS and a causal Transformer at about equal parameters, trained at
L = 512 for the same number of steps, 2 seeds; then every best checkpoint is scored on the same
held-out files with windows of 1x, 2x, 4x, 8x and 16x 512 tokens (`sptlib.protocol.lmeval`):

    python -m sptlib.compare --config=experiments/gss_lm.py --workdir=runs/gss_lm

`comparison.md` gets the bits-per-byte table (mean ± 95% CI per factor), the loss per position
bucket, and the equal-compute columns (validation bits per byte of every model at the same
compiled training FLOPs and at the same measured training seconds); plots:
`length_generalisation.png`, `equal_compute.png`. The grid runs as one process per core
(`config.compare.jobs = 0`). Measured on a 2-core machine: 13.1 min from a clean clone (docs/reproducing.md, "GSS").

Paper sizes (`get_config("pg19")`, `arxiv`, `github`, `lm1b`; add `model=gss-l` etc.):
GSS 16 layers, E=1024, F=4096, H=256, N=512 (GSS-L: 32 layers); GSS-Hybrid: attention blocks
(8 heads of 128) at layers 2, 6, 10, 14; DSS and a Transformer sized to GSS's parameter count;
Adam(W) lr from {6.4, 3.2, 1.6, 0.8}e-3 (`lr=`; default 3.2e-3), 1k warmup, cosine to 1e-6,
weight decay 0.1, gradient clip 1.0, no dropout, SSM parameters lr 1e-3 and no weight decay;
2^19 tokens per batch: 128 x 4096 (LM1B: 1024 x 512), 125k steps. `config.aot.slice = "v4-64"`:
the paper's "64 TPU-v4 cores" in Cloud TPU naming, where a v4 name counts TensorCores — 32 chips,
i.e. 32 JAX devices (megacore), 8 hosts. Data: TFDS `pg19`, `scientific_papers/arxiv` (arXiv
articles; the paper's arXiv Math set is not public), `lm1b`; `github` is `code_lm` over every
installed package (a stand-in: the paper's GitHub set is not public). Subwords: a SentencePiece
model (`--config.data.lm.spm_model=...`, `pip install sptlib[lm]`); bytes when unset.

    get_config("[dataset][,model=...][,regime=scratch][,lr=3.2e-3][,steps=N][,seeds=2]")
"""

from sptlib.configs import common, paper, presets
from sptlib.slices import meshes
from sptlib.train import config as train_config

POSITIONAL = ("dataset", "model", "regime")
MODELS = ("gss", "gss-hybrid", "dss", "transformer")
FACTORS = (1, 2, 4, 8, 16)

# Paper: datasets -> (task, max_bytes for code_lm, train length, batch).
PAPER_DATA = {"pg19": ("pg19", 4096, 128), "arxiv": ("arxiv", 4096, 128),
              "github": ("code_lm", 4096, 128), "lm1b": ("lm1b", 512, 1024)}
# Paper model sizes (GSS: section 4 / appendix A.2); DSS and Transformer at GSS's parameters.
PAPER_MODELS = {
    "gss": dict(n_layers=16, d_model=1024),
    "gss-l": dict(n_layers=32, d_model=1024),
    # Vanilla Transformer blocks (attention + FFN x4) at layers 2, 6, 10, 14.
    "gss-hybrid": dict(n_layers=16, d_model=1024, ffn_mult=4),
    "dss": dict(n_layers=12, d_model=1024, ffn_mult=4),
    "transformer": dict(n_layers=12, d_model=1024, ffn_mult=4),
}
# CPU default: ~equal parameters (counted in tests/test_lm_eval.py), L = 512.
CPU_MODELS = {
    "gss": dict(n_layers=4, d_model=64),
    "gss-hybrid": dict(n_layers=4, d_model=64),  # attention block without FFN (~equal params)
    "dss": dict(n_layers=3, d_model=64, ffn_mult=4),
    "transformer": dict(n_layers=3, d_model=64, ffn_mult=4),
}
CPU = dict(length=512, batch=8, steps=200, lr=3.2e-3, warmup=20, eval_every=25, d_state=64,
           max_bytes=4_000_000, eval_tokens=8 * 16 * 512)


def _lm_model(c, name, sizes, *, d_state, heads, head_dim):
    """Fills config.model for a causal LM `name` (gss | gss-l | gss-hybrid | dss | transformer)."""
    m = c.model
    base = {"gss-l": "gss"}.get(name, name)
    if base not in MODELS:
        raise ValueError(f"model={name!r}: expected one of {MODELS + ('gss-l',)}")
    presets.set_model(m, base, paper.TASKS["listops"], paper.Recipe(
        sizes["n_layers"], sizes["d_model"], 1, 0.0, 0.0, 1, n_heads=heads,
        ffn_mult=sizes.get("ffn_mult", 0)))
    m.causal = True
    m.encoder = "token"
    m.ffn_mult = sizes.get("ffn_mult", 0)  # GSS blocks ignore it; attention blocks use it
    m.gss.d_state = d_state
    m.gss.expansion = 4
    m.gss.d_ssm = sizes["d_model"] // 4
    m.dss.d_state = d_state
    m.attention.head_dim = head_dim
    m.attention.chunk_size = 512


def _optim(stage, lr, warmup, ssm):
    o = stage.optim
    o.lr, o.weight_decay, o.grad_clip = lr, 0.1, 1.0
    o.warmup_steps, o.schedule, o.min_lr_ratio = warmup, "cosine", 1e-6 / lr
    o.ssm_lr = 1e-3 if ssm else lr
    o.ssm_weight_decay = 0.0


def get_config(arg=""):
    a = common.parse_arg(arg, POSITIONAL)
    dataset = a.get("dataset", "cpu")
    model = a.get("model", "gss")
    regime = a.get("regime", "scratch")
    if regime != "scratch":
        raise ValueError(f"regime={regime!r}: the LM comparison trains from scratch only")
    cpu = dataset == "cpu"
    if not cpu and dataset not in PAPER_DATA:
        raise ValueError(f"dataset={dataset!r}: expected cpu or one of {sorted(PAPER_DATA)}")
    sizes = (CPU_MODELS if cpu else PAPER_MODELS).get(model)
    if sizes is None:
        raise ValueError(f"model={model!r}: expected one of "
                         f"{sorted(CPU_MODELS if cpu else PAPER_MODELS)}")
    task, length, batch = (("code_lm", CPU["length"], CPU["batch"]) if cpu
                           else PAPER_DATA[dataset])
    steps = int(a.get("steps", CPU["steps"] if cpu else 125_000))
    lr = float(a.get("lr", CPU["lr"] if cpu else 3.2e-3))
    warmup = CPU["warmup"] if cpu else 1000
    eval_every = CPU["eval_every"] if cpu else 5000
    c = train_config.base_config()
    with c.unlocked():
        c.data.task = task
        c.data.max_length = length
        if cpu:
            c.data.lm.max_bytes = CPU["max_bytes"]
            # Validation, test and the 1x-16x evaluation read the first 8 windows of 16 x 512.
            c.data.lm.eval_tokens = CPU["eval_tokens"]
        elif dataset == "github":
            c.data.lm.max_bytes = 10 ** 12  # every installed package's source
            c.data.lm.packages = ()  # filled by the user: --config.data.lm.packages=...
        _lm_model(c, model, sizes, d_state=CPU["d_state"] if cpu else 512,
                  heads=4 if cpu else 8, head_dim=16 if cpu else 128)
        c.stage_order = ("scratch",)
        s = c.stages.scratch
        s.objective.kind = "causal"
        s.num_steps, s.batch_size = steps, batch
        s.best_metric, s.best_mode = "bits_per_token", "min"
        s.eval_every = s.checkpoint_every = eval_every
        s.log_every = max(1, eval_every // 2)
        s.eval_steps = 0 if cpu else 50
        s.eval_batch_size = batch
        _optim(s, lr, warmup, ssm=model != "transformer")
        seeds = tuple(range(int(a.get("seeds", 2))))
        presets.add_compare(c, models=MODELS, regimes=("scratch",), seeds=seeds,
                            length_factors=FACTORS,
                            title=("GSS LM on the offline code corpus: train at 512 bytes, "
                                   "evaluate at 1x-16x" if cpu
                                   else f"GSS LM, paper sizes: {dataset}"))
        if cpu:
            # One process per core (sptlib.protocol.compare_jobs): small models use 2 cores better as
            # two 1-core processes than as one 2-core process.
            c.compare.jobs = 0
        else:
            c.aot.slice = "v4-64"
            c.mesh = meshes.mesh_preset("v4-64")
            c.model.scan_layers = True
            c.model.remat = True
            c.model.dtype = "bfloat16"
    c.lock()
    return c
