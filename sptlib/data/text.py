"""LRA Text: IMDB reviews (TFDS `imdb_reviews`) as byte ids, 4096 long; test is validation too."""

import numpy as np

from sptlib.data import sources, tokenizers
from sptlib.data.defaults import sequence_length, task_info
from sptlib.data.registry import Task, check_tokens, register

# LRA uses the IMDB test split for both validation and test.
SPLITS = {"train": "train", "validation": "test", "test": "test"}


def _as_bytes(text):
    return text.encode("utf-8") if isinstance(text, str) else bytes(text)


class TextSource:
    """IMDB reviews as byte ids, truncated at max_length (truncations counted once at load)."""

    def __init__(self, records, max_length):
        self._records = records
        self.max_length = max_length
        self.num_truncated = sum(
            len(_as_bytes(records[i]["text"])) > max_length for i in range(len(records)))

    def __len__(self):
        return len(self._records)

    def __getitem__(self, i):
        rec = self._records[i]
        ids = tokenizers.byte_tokens(_as_bytes(rec["text"])[:self.max_length])
        inputs, mask = sources.pad_tokens(ids, self.max_length)
        return {"inputs": inputs, "mask": mask, "label": np.int32(rec["label"]),
                "example_mask": np.bool_(True)}

    def filler(self):
        return {"inputs": np.zeros(self.max_length, np.int32),
                "mask": np.zeros(self.max_length, bool), "label": np.int32(0),
                "example_mask": np.bool_(False)}


@register("text")
def build(cfg):
    """The `text` Task (tokens only)."""
    check_tokens(cfg, "text")
    max_length = sequence_length(cfg)
    load = lambda split: TextSource(  # noqa: E731
        sources.tfds_source("imdb_reviews", SPLITS[split], cfg), max_length)
    return Task(cfg, task_info(cfg), load)
