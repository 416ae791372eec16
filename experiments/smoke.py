"""Smoke test: tiny ListOps, masked SPT (pretrain) -> finetune, under a minute on 2 CPU cores.

    python -m sptlib.main --config=experiments/smoke.py --workdir=/tmp/spt_smoke

Generates a small ListOps set under `config.data.lra_dir` (default `lra_release/` in the data folder:
$SPTLIB_DATA, else ~/.cache/sptlib/data; override with --config.data.lra_dir=DIR) when that folder
holds none. Expected: both
stages finish (~30 steps each); validation accuracy is near chance (~0.2) at this size — the run
checks the plumbing (checkpoints, transfer, results), not the method.
"""

from sptlib.train import config as config_lib


def get_config(arg=None):
    del arg
    c = config_lib.base_config()
    c.seed = 0
    # Data: generated ListOps, short sequences.
    c.data.task = "listops"
    c.data.max_length = 128
    c.data.generate.enabled = True
    c.data.generate.num_train = 512
    c.data.generate.num_val = 64
    c.data.generate.num_test = 64
    c.data.generate.min_length = 20
    c.data.generate.max_length = 128
    c.data.read_threads = 1
    c.data.prefetch_buffer_size = 4
    # Model: 2 tiny pre-norm Transformer blocks (any mixer works: --config.model.mixer=s4d).
    c.model.mixer = "attention"
    c.model.d_model = 32
    c.model.n_layers = 2
    c.model.attention.n_heads = 2
    for name in ("pretrain", "finetune", "scratch"):
        c.stages[name].update(num_steps=30, batch_size=16, eval_batch_size=32, eval_every=10,
                              checkpoint_every=10, keep=2, log_every=10)
        c.stages[name].optim.update(lr=3e-3, warmup_steps=5)
    c.stages.pretrain.objective.mask_rate = 0.1
    return c
