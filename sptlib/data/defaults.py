"""Each task's `Task.info` from its `config.data` alone: no data read, no JAX (grain) imported
(except for the user's tasks: `files` reads its files once, an import-path task builds itself).

`task_info(config.data)` is the one home of every task's vocabulary size, class count, sequence
length, channels and pairing: the builders (`sptlib.data.catalog`) return it as `task.info`, and
code that must not read data (FLOP estimates, AOT compiles, benchmarks) calls it directly.
"""

from sptlib.data import user_code
from sptlib.data import lm, mad, probes, tokenizers, user_files

# Sequence length when `max_length` is 0 (speech_commands: one second at 16 kHz).
DEFAULT_LENGTHS = {"listops": 2000, "text": 4096, "retrieval": 4000, "speech_commands": 16000,
                   "code_bytes": 2048, "associative_recall": 128, "selective_copying": 256,
                   # MAD's baseline lengths (sptlib.data.mad.MAD_SETTINGS), zoology's MQAR 64.
                   **{t: mad.MAD_SETTINGS[t][0]["length"] for t in mad.MAD_TASKS},
                   "mqar": 64, "induction_heads": 64,
                   **{name: lm.DEFAULT_LENGTH for name in lm.LM_TASKS}}
# Image side when `resolution` is 0; these tasks are resolution x resolution long.
DEFAULT_RESOLUTIONS = {"pathfinder": 32, "pathx": 128, "pathx256": 256, "lines": 16,
                       "fashion_mnist": 28}
CIFAR_LENGTH = 32 * 32
# Classes of the classification tasks (lines: `lines.CLASS_NAMES`; speech_commands: SC35's
# `speech_commands.WORDS`; tests/test_data_tasks.py checks both against the readers).
NUM_CLASSES = {"listops": 10, "text": 2, "retrieval": 2, "image": 10, "scifar": 10,
               "pathfinder": 2, "pathx": 2, "pathx256": 2, "lines": 4, "fashion_mnist": 10,
               "speech_commands": 35}
# Tasks that read token ids only (byte-level text or ListOps tokens).
TOKEN_ONLY = {"listops": tokenizers.LISTOPS_VOCAB_SIZE, "text": tokenizers.BYTE_VOCAB_SIZE,
              "retrieval": tokenizers.BYTE_VOCAB_SIZE}


def info(name, *, vocab_size, num_classes, max_length, input_type, d_input=1, pair=False):
    """A `Task.info` dict: vocab_size (incl. reserved ids; 0 for continuous inputs), num_classes
    (0 for causal LMs), max_length, input_type (tokens | continuous), d_input, pair."""
    return dict(name=name, vocab_size=vocab_size, num_classes=num_classes, max_length=max_length,
                input_type=input_type, d_input=d_input, pair=pair)


def resolution(cfg) -> int:
    """Image side of an image-grid task (`DEFAULT_RESOLUTIONS`) from its `config.data`."""
    return int(cfg.resolution) or DEFAULT_RESOLUTIONS[cfg.task]


def sequence_length(cfg) -> int:
    """The task's `Task.info['max_length']` from its `config.data`."""
    if cfg.task == "files" or user_code.is_import_path(cfg.task):
        return int(task_info(cfg)["max_length"])
    if cfg.task in DEFAULT_RESOLUTIONS:
        return resolution(cfg) ** 2
    if cfg.task in ("image", "scifar"):
        # Tokens of RGB images interleave the channels: 3072 ids per image.
        rgb_tokens = cfg.task == "scifar" and cfg.input_type == "tokens"
        return CIFAR_LENGTH * (3 if rgb_tokens else 1)
    return int(cfg.max_length) or DEFAULT_LENGTHS[cfg.task]


def task_info(cfg) -> dict:
    """`get_task(cfg).info` without touching data on disk (`cfg` is `config.data`)."""
    t = cfg.task
    if t == "files":  # the user's files: read once (memoised), sptlib/data/user_files.py
        return user_files.task_info(cfg)
    if user_code.is_import_path(t):
        # The user's builder is the only source of its info (it imports grain: JAX).
        return dict(user_code.build_task(cfg).info)
    length = sequence_length(cfg)
    if t in lm.LM_TASKS:
        # Causal LMs: bytes, or the SentencePiece model's vocabulary when one is configured.
        return info(t, vocab_size=lm.vocab_size(cfg), num_classes=0, max_length=length,
                    input_type="tokens")
    if t in probes.PROBES:
        # Per-position labelling: batches carry `targets` [batch, length] instead of `label`.
        p = probes.info(t, **probes.options_from(t, cfg.probes, length))
        out = info(t, vocab_size=p["vocab_size"], num_classes=p["num_classes"],
                   max_length=length, input_type="tokens")
        out["per_position"] = True
        return out
    if t == "code_bytes":  # one class per package (sptlib/data/code_bytes.py)
        return info(t, vocab_size=tokenizers.BYTE_VOCAB_SIZE,
                    num_classes=len(cfg.code_bytes.packages), max_length=length,
                    input_type="tokens")
    if t in TOKEN_ONLY:
        return info(t, vocab_size=TOKEN_ONLY[t], num_classes=NUM_CLASSES[t], max_length=length,
                    input_type="tokens", pair=t == "retrieval")
    if t not in NUM_CLASSES:
        raise ValueError(f"unknown task {t!r}; expected one of {sorted(NUM_CLASSES)}")
    tokens = cfg.input_type == "tokens"
    channels = 3 if t == "scifar" else 1
    return info(t, vocab_size=tokenizers.PIXEL_VOCAB_SIZE if tokens else 0,
                num_classes=NUM_CLASSES[t], max_length=length, input_type=cfg.input_type,
                d_input=1 if tokens else channels)
