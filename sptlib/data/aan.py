"""AAN retrieval (LRA): `<lra_dir>/tsv_data/new_aan_pairs.{train,eval,test}.tsv`.

No header, no quoting, five tab-separated columns: `label id1 id2 text1 text2`; the label is 0/1
(the release writes it as a float, e.g. `1.0`). Documents are byte-level (id = byte + 2).
"""

import logging
import os

import numpy as np

from sptlib.data.errors import BOM, DataError, located

FOLDER = "tsv_data"
SPLIT_FILES = {"train": "new_aan_pairs.train.tsv", "validation": "new_aan_pairs.eval.tsv",
               "test": "new_aan_pairs.test.tsv"}


def split_path(lra_dir, split):
    return os.path.join(lra_dir, FOLDER, SPLIT_FILES[split])


def parse_label(text, path, lineno):
    try:
        value = float(text)
    except ValueError:
        raise located(path, lineno, f"label {text!r} is not a number") from None
    if value not in (0.0, 1.0):
        raise located(path, lineno, f"label {text!r} is not 0 or 1")
    return int(value)


def read_split(path):
    """Parses an AAN TSV -> (raw bytes arrays of doc 1, of doc 2, int32 labels [n]).

    Documents are returned as uint8 arrays of their UTF-8 bytes (ids are byte + 2).
    """
    if not os.path.exists(path):
        raise DataError(f"{path}: AAN retrieval split file not found")
    docs1, docs2, labels = [], [], []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if lineno == 1 and line.startswith(BOM):  # a UTF-8 byte-order mark: not data
                line = line[len(BOM):]
            line = line.rstrip(b"\n").rstrip(b"\r")
            if not line:
                continue
            cols = line.split(b"\t")
            if len(cols) != 5:
                raise located(path, lineno, f"expected 5 tab-separated columns "
                                            f"(label id1 id2 text1 text2), got {len(cols)}")
            labels.append(parse_label(cols[0].decode("utf-8", "replace"), path, lineno))
            docs1.append(np.frombuffer(cols[3], np.uint8))
            docs2.append(np.frombuffer(cols[4], np.uint8))
    logging.info("AAN: read %d pairs from %s", len(labels), path)
    return docs1, docs2, np.asarray(labels, np.int32)
