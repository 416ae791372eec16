"""Causal LM tasks (`code_lm`, `pg19`, `lm1b`, `arxiv`): their builder, over the readers of `lm.py`.

Every split is `lm.WindowSource` over the split's token stream with windows of
`data.max_length` tokens (default `lm.DEFAULT_LENGTH`, 512). Validation and test read only the
first `data.lm.eval_tokens` tokens when that is set, so longer windows see the same text.
(`lm.py` stays apart from this builder: `config.data` imports it, and the builder needs grain.)
"""

from sptlib.data import lm
from sptlib.data.defaults import sequence_length, task_info
from sptlib.data.registry import Task, check_tokens, register


@register(*lm.LM_TASKS)
def build(cfg):
    check_tokens(cfg, cfg.task)
    length = sequence_length(cfg)

    def load(split):
        limit = int(cfg.lm.eval_tokens) if split != "train" else 0
        if cfg.task == "code_lm":
            stream = lm.corpus_for(cfg.lm).streams[split]
        else:
            stream = lm.tfds_stream(cfg.task, split, cfg, max_tokens=limit)
        return lm.WindowSource(stream, length, limit_tokens=limit)

    info = task_info(cfg)
    if cfg.task == "code_lm":
        info["corpus_checksum"] = lm.corpus_for(cfg.lm).manifest["checksum"]
    return Task(cfg, info, load)
