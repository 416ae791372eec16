"""The synthetic probes as tasks (`associative_recall`, `selective_copying`), over `probes.py`.

Each split is generated in memory on first use from `config.data.probes` (sizes, `seed`) and
`data.max_length`: train, validation and test are `num_train`, `num_val` and `num_test`
sequences from the seed's three disjoint streams (`probes.SPLIT_TAGS`). Batches carry `targets`
int32 `[batch, length]` (the answer class at scored positions, -1 elsewhere) instead of `label`;
`info["per_position"]` says so (the `tagging` objective reads them). (`probes.py` stays apart
from this builder: `defaults.task_info` imports it, and the builder needs grain.)
"""

import logging

from sptlib.data import probes, sources
from sptlib.data.defaults import sequence_length, task_info
from sptlib.data.registry import Task, check_tokens, register

SPLIT_SIZES = {"train": "num_train", "validation": "num_val", "test": "num_test"}


@register(*probes.PROBES)
def build(cfg):
    """The probe Task named by `cfg.task` (sequences of `data.max_length`, default 128 / 256)."""
    check_tokens(cfg, cfg.task)
    options = probes.options_from(cfg.task, cfg.probes, sequence_length(cfg))
    info = task_info(cfg)  # checks the sizes before anything is generated

    def load(split):
        num = int(cfg.probes[SPLIT_SIZES[split]])
        logging.info("%s: generating %d %s sequences (seed %d)", cfg.task, num, split,
                     int(cfg.probes.seed))
        d = probes.generate(cfg.task, num, seed=int(cfg.probes.seed),
                            held_out=probes.SPLIT_TAGS[split] or False, **options)
        return sources.PositionSource(d["inputs"], d["targets"], d["mask"])

    return Task(cfg, info, load)
