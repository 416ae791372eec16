"""Random-access sources over the user's files (`sptlib.data.user_files`): one row -> one example
of the batch contract (`sptlib.data.sources`): inputs, mask, label, example_mask (+ raw for floats).

Token ids are shifted past the reserved ids (`sptlib.vocab`: <pad> 0, <mask> 1); a character
vocabulary also reserves <unk> (`CHAR_UNK`, for characters the train file never shows). Floats
are normalised per channel by the train file's mean and standard deviation; `raw` holds them
quantised to 0..255 over the train file's range (the `pixel256` target).
"""

from __future__ import annotations

import numpy as np

from sptlib import vocab
from sptlib.data import user_columns as cols

CHAR_UNK = vocab.NUM_SPECIAL  # characters not in the train file's alphabet


class Encoder:
    """A column chunk -> (flat, offsets) token ids or floats, labels -> class ids."""

    def __init__(self, kind, text_vocab="bytes", chars=None, classes=None):
        self.kind, self.text_vocab = kind, text_vocab
        self.char_ids = {ch: i + CHAR_UNK + 1 for i, ch in enumerate(chars or "")}
        self.class_ids = None if classes is None else {c: i for i, c in enumerate(classes)}
        self._sp = None

    def inputs(self, values, where):
        if self.kind == "floats":
            return cols.floats(values, where)
        if self.kind == "tokens":
            return cols.tokens(values, where)
        return self.text_ids(cols.texts(values, where))

    def text_ids(self, rows):
        if self.text_vocab == "bytes":
            ids = [np.frombuffer(s.encode("utf-8"), np.uint8).astype(np.int64) for s in rows]
        elif self.text_vocab == "chars":
            ids = [np.asarray([self.char_ids.get(ch, CHAR_UNK) for ch in s], np.int64)
                   for s in rows]
        else:
            if self._sp is None:
                import sentencepiece as spm  # optional: pip install sptlib[lm]
                self._sp = spm.SentencePieceProcessor(model_file=self.text_vocab)
            ids = [np.asarray(self._sp.encode(s), np.int64) for s in rows]
        flat = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        return flat, np.concatenate([[0], np.cumsum([len(a) for a in ids])]).astype(np.int64)


class FileSource:
    """Random access to one split: rows of a `Table` (all, or `rows`) encoded as the batch
    contract (`sptlib.data.sources`): inputs, mask, label, example_mask (+ raw for floats)."""

    def __init__(self, table, spec, rows=None, num_truncated=0):
        self.table, self.spec, self.rows = table, spec, rows
        self.num_truncated = num_truncated
        self.max_length = int(spec["max_length"])
        self._enc = Encoder(spec["kind"], spec.get("text_vocab") or "bytes", spec.get("chars"),
                             spec.get("classes"))
        if spec["kind"] == "floats":
            self._mean, self._std = np.asarray(spec["mean"]), np.asarray(spec["std"])
            lo, hi = np.asarray(spec["min"]), np.asarray(spec["max"])
            self._lo, self._scale = lo, np.where(hi > lo, 255.0 / np.maximum(hi - lo, 1e-12), 0)

    def __len__(self):
        return self.table.num_rows if self.rows is None else len(self.rows)

    def _row(self, r):
        """Row `r` of the table as (values [length(, channels)], label or None): only that row
        is converted (the scan already checked every value); the table caches decoded chunks."""
        start, chunk = self.table.chunk_of(r)
        j = r - start
        flat, _ = self._enc.inputs(_take(chunk["inputs"], j),
                                   cols.Where(self.table, "inputs", r))
        label = None
        if "label" in chunk:
            lab = cols.labels(_take(chunk["label"], j), cols.Where(self.table, "label", r),
                              self._enc.class_ids is None)
            label = int(lab[0]) if self._enc.class_ids is None else \
                self._enc.class_ids[_class_key(lab.tolist()[0], self._enc.class_ids)]
        return flat, label

    def __getitem__(self, i):
        r = int(i) if self.rows is None else int(self.rows[i])
        x, label = self._row(r)
        x = x[:self.max_length]
        n, L = len(x), self.max_length
        mask = np.zeros(L, bool)
        mask[:n] = True
        ex = {"mask": mask, "label": np.int32(label or 0),
              "example_mask": np.bool_(True)}
        if self.spec["kind"] == "floats":
            c = x.shape[1]
            inputs, raw = np.zeros((L, c), np.float32), np.zeros((L, c), np.int32)
            inputs[:n] = (x - self._mean) / self._std
            raw[:n] = np.clip(np.rint((x - self._lo) * self._scale), 0, 255)
            ex.update(inputs=inputs, raw=raw)
        else:
            inputs = np.zeros(L, np.int32)
            inputs[:n] = x + (vocab.NUM_SPECIAL if not (
                self.spec["kind"] == "text" and self.spec.get("chars") is not None) else 0)
            ex["inputs"] = inputs
        return ex

    def filler(self):
        L = self.max_length
        ex = {"mask": np.zeros(L, bool), "label": np.int32(0), "example_mask": np.bool_(False)}
        if self.spec["kind"] == "floats":
            c = int(self.spec["channels"])
            ex.update(inputs=np.zeros((L, c), np.float32), raw=np.zeros((L, c), np.int32))
        else:
            ex["inputs"] = np.zeros(L, np.int32)
        return ex


def _class_key(v, class_ids):
    """A label cell as its class name; integers written as text (" 01") name the class of
    their value ("1"), as the scan read them (`user_files`: classes of integer text)."""
    if v in class_ids:
        return v
    text = str(v).strip()
    return str(int(text)) if text.lstrip("-").isdigit() else v


def _take(values, j):
    """Row `j` of a column chunk, as a one-row column of the same kind."""
    if isinstance(values, (list, np.ndarray)):
        return values[j:j + 1]
    return values.slice(j, 1)
