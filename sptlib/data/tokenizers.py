"""Tokenisers. Every vocabulary keeps `<pad>`=0 and `<mask>`=1 (`sptlib.vocab`); real tokens
start at `NUM_SPECIAL`, so embeddings learned during self-pretraining transfer to finetuning.

- ListOps: the 15 symbols of the LRA ListOps grammar (digits, 4 operators, `]`); parentheses are
  dropped (they carry no information beyond `]`).
- Bytes (Text, Retrieval): id = byte + 2, vocabulary 258.
- Pixels (Image, Pathfinder, Fashion-MNIST): id = value + 2, vocabulary 258; continuous inputs
  instead keep the normalised float value and the raw 0..255 value (`raw`).
- Audio (Speech Commands): 8-bit mu-law codes play the role of pixel values.
"""

import numpy as np

from sptlib import vocab

LISTOPS_SYMBOLS = tuple(str(d) for d in range(10)) + ("[MIN", "[MAX", "[MED", "[SM", "]")
LISTOPS_IDS = {s: i + vocab.NUM_SPECIAL for i, s in enumerate(LISTOPS_SYMBOLS)}
LISTOPS_VOCAB_SIZE = vocab.NUM_SPECIAL + len(LISTOPS_SYMBOLS)
BYTE_VOCAB_SIZE = vocab.NUM_SPECIAL + 256
PIXEL_VOCAB_SIZE = vocab.NUM_SPECIAL + 256


def listops_tokens(source):
    """Tokenises a ListOps source string `( ( [MAX 2 ) 9 ) ] )` -> int ids (no parentheses).

    Raises KeyError(symbol) on an unknown symbol (the reader turns it into a located error).
    """
    return np.asarray([LISTOPS_IDS[s] for s in source.split() if s not in ("(", ")")],
                      dtype=np.int32)


def byte_tokens(text):
    """UTF-8 bytes of `text` (str or bytes) -> int32 ids byte + 2, shape [num_bytes]."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    return np.frombuffer(text, dtype=np.uint8).astype(np.int32) + vocab.NUM_SPECIAL


def pixel_tokens(pixels):
    """uint8 pixel values (any shape) -> int32 ids value + 2 (same shape)."""
    return np.asarray(pixels, dtype=np.int32) + vocab.NUM_SPECIAL


def normalise_pixels(pixels):
    """uint8 values 0..255 -> float32 in [-1, 1] (the continuous input path)."""
    return np.asarray(pixels, dtype=np.float32) * (2.0 / 255.0) - 1.0


def mu_law_encode(audio, bits=8):
    """Float audio in [-1, 1] -> integer mu-law codes 0..2**bits-1 (same shape)."""
    mu = 2 ** bits - 1
    audio = np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0)
    y = np.sign(audio) * np.log1p(mu * np.abs(audio)) / np.log1p(mu)
    return np.clip(np.floor((y + 1.0) / 2.0 * mu + 0.5), 0, mu).astype(np.int32)
