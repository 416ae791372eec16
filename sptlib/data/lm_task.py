"""Causal LM tasks (`code_lm`, `pg19`, `lm1b`, `arxiv`); importing this module registers them in `tasks`.

Every split is `lm.WindowSource` over the split's token stream with windows of
`data.max_length` tokens (default 512). Validation and test read only the first
`data.lm.eval_tokens` tokens when that is set, so longer windows see the same text.
"""

from sptlib.data import lm
from sptlib.data.tasks import Task, _check_tokens, _info, register

DEFAULT_LENGTH = 512


def _lm_task(cfg):
    _check_tokens(cfg, cfg.task)
    length = int(cfg.max_length) or DEFAULT_LENGTH

    def load(split):
        limit = int(cfg.lm.eval_tokens) if split != "train" else 0
        if cfg.task == "code_lm":
            stream = lm.corpus_for(cfg.lm).streams[split]
        else:
            stream = lm.tfds_stream(cfg.task, split, cfg, max_tokens=limit)
        return lm.WindowSource(stream, length, limit_tokens=limit)

    info = _info(cfg.task, vocab_size=lm.vocab_size(cfg), num_classes=0, max_length=length,
                 input_type="tokens")
    if cfg.task == "code_lm":
        info["corpus_checksum"] = lm.corpus_for(cfg.lm).manifest["checksum"]
    return Task(cfg, info, load)


for _name in lm.LM_TASKS:
    register(_name)(_lm_task)
