r"""The synthetic probes as a `sptlib.compare` grid: models x regimes x seeds, SPT included.

    python -m sptlib.compare --config=experiments/probes.py:associative_recall --workdir=DIR
    python -m sptlib.compare --config=experiments/probes.py:selective_copying --workdir=DIR

Tasks (`sptlib.data.probes`, built by `sptlib.data.probe_tasks`): associative_recall (MQAR, 16
key-value pairs, L = 128, key and value vocabularies of 16) and selective_copying (16 tokens of a
16-token vocabulary among blanks, L = 256): the sizes of `experiments/selective.py`. NUM_TRAIN
training sequences (one epoch of STEPS batches), NUM_EVAL validation and NUM_EVAL test sequences,
from three disjoint streams of `data_seed`; the test set is the held-out set of
experiments/selective.py at the same seed.

Grid: {mamba, mamba2, s4d, transformer} x {scratch (STEPS), scratch-equal-compute
(PRETRAIN_STEPS + STEPS), spt-masked (masked denoising of MASK_RATE of the tokens for
PRETRAIN_STEPS, then STEPS of labelling from its best checkpoint, head re-initialised)} x seeds
{0, 1, 2}. The labelling stages train the `tagging` objective: cross-entropy and accuracy at the
answer positions only (validation `exact`: sequences with every answer right). Every model is
causal in every stage (the probes are causal tasks), 2 layers, d_model 64; the Transformer has 4
heads, rotary positions and FFN x 2, the SSMs no FFN (S4D N = 64, Mamba N = 16 with scan chunk 2,
Mamba-2 N = 64, heads of 32, chunk 16: the CPU settings of experiments/selective.py); AdamW lr
1e-3, warmup + cosine, weight decay 0.01, batch 16 (`sptlib.configs.cpu_sized.comparison`).
Nothing here was timed as a grid: experiments/selective.py's docstring has per-step CPU costs of
these models at these sizes.

    get_config("task[,model,regime][,steps=..][,pretrain_steps=..][,lr=..][,batch=..]
                [,d_model=..][,n_layers=..][,num_train=..][,num_eval=..][,eval_every=..]
                [,mask_rate=..][,data_seed=..]")
"""

from sptlib.configs import common, cpu_sized

POSITIONAL = ("task", "model", "regime")

# Options of each probe (config.data.probes fields) and its length (config.data.max_length).
TASKS = {"associative_recall": (128, dict(num_pairs=16, key_vocab=16, value_vocab=16)),
         "selective_copying": (256, dict(num_tokens=16, data_vocab=16))}
MODELS = ("mamba", "mamba2", "s4d", "transformer")
REGIMES = ("scratch", "scratch-equal-compute", "spt-masked")
STEPS = PRETRAIN_STEPS = 1000
BATCH = 16
NUM_TRAIN = STEPS * BATCH
NUM_EVAL = 1000
MASK_RATE = 0.15


def get_config(arg="associative_recall"):
    a = common.parse_arg(arg, POSITIONAL)
    task = a.get("task", "associative_recall")
    if task not in TASKS:
        raise ValueError(f"unknown probe task {task!r}; known: {sorted(TASKS)}")
    model = a.get("model", "transformer")
    length, options = TASKS[task]
    c = cpu_sized.probe(
        model, a.get("regime", "spt-masked"), task=task, length=length, options=options,
        num_train=int(a.get("num_train", NUM_TRAIN)), num_eval=int(a.get("num_eval", NUM_EVAL)),
        data_seed=int(a.get("data_seed", 0)), mask_rate=float(a.get("mask_rate", MASK_RATE)),
        n_layers=int(a.get("n_layers", 2)), d_model=int(a.get("d_model", 64)),
        steps=int(a.get("steps", STEPS)), pretrain_steps=int(a.get("pretrain_steps",
                                                                   PRETRAIN_STEPS)),
        batch_size=int(a.get("batch", BATCH)), lr=float(a.get("lr", 1e-3)),
        eval_every=int(a.get("eval_every", 200)), n_heads=4,
        ffn_mult=2 if model == "transformer" else 0, positions="rotary",
        compare=dict(models=MODELS, regimes=REGIMES, seeds=(0, 1, 2),
                     title=f"Synthetic probe {task} (L={length}): scratch vs masked SPT"))
    with c.unlocked():
        # CPU-fast scan chunks, measured in experiments/selective.py (same numerics).
        c.model.mamba.chunk_size = 2
        c.model.mamba2.head_dim, c.model.mamba2.chunk_size = 32, 16
    return c
