"""Task builders other than ListOps; importing this module registers them in `tasks`."""

import logging
import os

import numpy as np

from sptlib.data import (aan, fashion_mnist, lines, pathfinder, sources, speech_commands,
                         tokenizers)
from sptlib.data.tasks import Task, _check_tokens, _info, missing_lra_error, register

# ---------------------------------------------------------------------------------------------
# Retrieval (AAN)


@register("retrieval")
def _retrieval(cfg):
    _check_tokens(cfg, "retrieval")
    max_length = int(cfg.max_length) or 4000
    if not os.path.exists(aan.split_path(cfg.lra_dir, "train")):
        raise missing_lra_error(cfg.lra_dir, f"{aan.FOLDER}/{aan.SPLIT_FILES['train']}",
                                "retrieval")
    if cfg.source == "tfds":
        from sptlib.data import lra_tfds
        load = lambda split: lra_tfds.retrieval_source(cfg, split, max_length)  # noqa: E731
    else:
        def load(split):
            d1, d2, labels = aan.read_split(aan.split_path(cfg.lra_dir, split))
            return sources.PairTokenSource(d1, d2, labels, max_length,
                                           id_offset=tokenizers.vocab.NUM_SPECIAL)
    info = _info("retrieval", vocab_size=tokenizers.BYTE_VOCAB_SIZE, num_classes=2,
                 max_length=max_length, input_type="tokens", pair=True)
    return Task(cfg, info, load)


# ---------------------------------------------------------------------------------------------
# Pathfinder / PathX

_PATHFINDER_RES = {"pathfinder": 32, "pathx": 128, "pathx256": 256}


def _pathfinder(cfg):
    res = int(cfg.resolution) or _PATHFINDER_RES[cfg.task]
    difficulty = cfg.difficulty
    if difficulty not in pathfinder.DIFFICULTIES.values():
        raise ValueError(f"difficulty must be one of {sorted(pathfinder.DIFFICULTIES.values())}")
    folder = pathfinder.folder_path(cfg.lra_dir, res, difficulty)
    contour = {v: k for k, v in pathfinder.DIFFICULTIES.items()}[difficulty]
    if not os.path.isdir(os.path.join(folder, "metadata")):
        gen = cfg.generate
        if gen.enabled:
            contour = int(gen.contour_length) or contour
            num = gen.num_train + gen.num_val + gen.num_test
            logging.info("Pathfinder: generating %d images at %d px in %s", num, res, cfg.lra_dir)
            # Validation and test images from a seed never used for training images.
            pathfinder.generate_release(cfg.lra_dir, resolution=res, num=num, seed=gen.seed,
                                        contour_length=contour,
                                        held_out_from=pathfinder.train_size(num))
        else:
            raise missing_lra_error(
                cfg.lra_dir, f"pathfinder{res}/{difficulty}/metadata/", cfg.task,
                f"python -m sptlib.data pathfinder --out {cfg.lra_dir} --resolution {res} "
                f"--num 200000 --seed 0 --contour_length {contour}")
    max_length = res * res
    if int(cfg.max_length) and int(cfg.max_length) != max_length:
        raise ValueError(f"{cfg.task}: max_length is fixed at {max_length} (resolution {res})")
    state = {}

    def load(split):
        if cfg.source == "tfds":
            from sptlib.data import lra_tfds
            return lra_tfds.pathfinder_source(cfg, split, res, difficulty)
        if "index" not in state:
            state["index"] = pathfinder.read_index(folder)
        entries, empty = state["index"]
        return pathfinder.PathfinderSource(pathfinder.split_entries(entries, split), res,
                                           cfg.input_type, num_empty=empty)

    tokens = cfg.input_type == "tokens"
    info = _info(cfg.task, vocab_size=tokenizers.PIXEL_VOCAB_SIZE if tokens else 0,
                 num_classes=2, max_length=max_length, input_type=cfg.input_type)
    return Task(cfg, info, load)


for _name in _PATHFINDER_RES:
    register(_name)(_pathfinder)


# ---------------------------------------------------------------------------------------------
# Lines (generated in memory)


@register("lines")
def _lines(cfg):
    res = int(cfg.resolution) or 16
    if res < 8:
        raise ValueError(f"lines: resolution must be >= 8, got {res}")
    if int(cfg.max_length) and int(cfg.max_length) != res * res:
        raise ValueError(f"lines: max_length is fixed at {res * res} (resolution {res})")
    gen = cfg.generate
    state = {}

    def load(split):
        if "splits" not in state:  # one draw for all three splits (train vs held-out streams)
            logging.info("Lines: generating %d/%d/%d images at %d px (seed %d)", gen.num_train,
                         gen.num_val, gen.num_test, res, gen.seed)
            state["splits"] = lines.split(int(gen.num_train), int(gen.num_val),
                                          int(gen.num_test), resolution=res, seed=int(gen.seed),
                                          noise=float(gen.noise), style=str(gen.style))
        images, labels = state["splits"][split]
        return sources.ArraySource(images.reshape(len(images), -1, 1), labels, cfg.input_type)

    tokens = cfg.input_type == "tokens"
    info = _info("lines", vocab_size=tokenizers.PIXEL_VOCAB_SIZE if tokens else 0,
                 num_classes=lines.NUM_CLASSES, max_length=res * res, input_type=cfg.input_type)
    return Task(cfg, info, load)


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST (offline, Debian package)


@register("fashion_mnist")
def _fashion_mnist(cfg):
    res = int(cfg.resolution) or 28

    def load(split):
        images, labels = fashion_mnist.load(cfg.fashion_mnist_dir, split, res)
        return sources.ArraySource(images.reshape(len(images), -1, 1), labels, cfg.input_type)

    # Fail early, with the install hint, if the files are missing.
    if not os.path.isdir(cfg.fashion_mnist_dir):
        fashion_mnist.load(cfg.fashion_mnist_dir, "test", res)
    tokens = cfg.input_type == "tokens"
    info = _info("fashion_mnist", vocab_size=tokenizers.PIXEL_VOCAB_SIZE if tokens else 0,
                 num_classes=10, max_length=res * res, input_type=cfg.input_type)
    return Task(cfg, info, load)


# ---------------------------------------------------------------------------------------------
# TFDS-backed tasks (read with random access from the ArrayRecord copy: `tfds.data_source`)


def _tfds_source(name, split, cfg):
    import tensorflow_datasets as tfds
    kwargs = {"data_dir": cfg.tfds_data_dir} if cfg.tfds_data_dir else {}
    try:
        return tfds.data_source(name, split=split, download=False, **kwargs)
    except Exception as e:
        raise RuntimeError(
            f"TFDS dataset {name!r} (split {split!r}) is not prepared in ArrayRecord format under "
            f"{cfg.tfds_data_dir or 'the default TFDS data dir'}; prepare it once with "
            f"`tfds build {name} --file_format=array_record"
            f"{' --data_dir=' + cfg.tfds_data_dir if cfg.tfds_data_dir else ''}` "
            f"({type(e).__name__}: {e})") from e


class _TextSource:
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
        inputs, mask = sources._pad_tokens(ids, self.max_length)
        return {"inputs": inputs, "mask": mask, "label": np.int32(rec["label"]),
                "example_mask": np.bool_(True)}

    def filler(self):
        return {"inputs": np.zeros(self.max_length, np.int32),
                "mask": np.zeros(self.max_length, bool), "label": np.int32(0),
                "example_mask": np.bool_(False)}


def _as_bytes(text):
    return text.encode("utf-8") if isinstance(text, str) else bytes(text)


@register("text")
def _text(cfg):
    _check_tokens(cfg, "text")
    max_length = int(cfg.max_length) or 4096
    # LRA uses the IMDB test split for both validation and test.
    splits = {"train": "train", "validation": "test", "test": "test"}
    load = lambda split: _TextSource(_tfds_source("imdb_reviews", splits[split], cfg),  # noqa
                                     max_length)
    info = _info("text", vocab_size=tokenizers.BYTE_VOCAB_SIZE, num_classes=2,
                 max_length=max_length, input_type="tokens")
    return Task(cfg, info, load)


def _greyscale(rgb):
    """ITU-R 601 luma as in tf.image.rgb_to_grayscale, rounded to uint8: [..., 3] -> [...]."""
    y = rgb.astype(np.float32) @ np.asarray([0.2989, 0.5870, 0.1140], np.float32)
    return np.clip(np.round(y), 0, 255).astype(np.uint8)


_CIFAR_SPLITS = {"train": "train[:45000]", "validation": "train[45000:]", "test": "test"}


def _cifar(cfg, rgb):
    channels = 3 if rgb else 1
    tokens = cfg.input_type == "tokens"

    def decode(rec):
        img = np.asarray(rec["image"])
        values = img.reshape(-1, 3) if rgb else _greyscale(img).reshape(-1, 1)
        ex = sources.encode_values(values, cfg.input_type)
        ex["label"] = np.int32(rec["label"])
        return ex

    def filler():
        ex = sources.filler_values(cfg.input_type, 1024, channels)
        ex["label"] = np.int32(0)
        return ex

    load = lambda split: sources.MappedSource(  # noqa: E731
        _tfds_source("cifar10", _CIFAR_SPLITS[split], cfg), decode, filler)
    name = "scifar" if rgb else "image"
    # Tokens of RGB images interleave the channels: 3072 ids per image.
    info = _info(name, vocab_size=tokenizers.PIXEL_VOCAB_SIZE if tokens else 0, num_classes=10,
                 max_length=1024 * channels if tokens else 1024, input_type=cfg.input_type,
                 d_input=1 if tokens else channels)
    return Task(cfg, info, load)


register("image")(lambda cfg: _cifar(cfg, rgb=False))
register("scifar")(lambda cfg: _cifar(cfg, rgb=True))


@register("speech_commands")
def _speech_commands(cfg):
    """SC35 from the raw v0.02 release (sptlib/data/speech_commands.py)."""
    length = int(cfg.max_length) or speech_commands.LENGTH
    root = cfg.speech_commands_dir
    speech_commands.check_root(root)  # a missing or partial release fails before training
    if cfg.source == "tfds":
        from sptlib.data import speech_commands_tfds
        load = lambda split: speech_commands_tfds.source(cfg, split, length)  # noqa: E731
    else:
        def load(split):
            return speech_commands.SpeechCommandsSource(
                root, speech_commands.list_split(root, split), length, cfg.input_type)
    tokens = cfg.input_type == "tokens"
    info = _info("speech_commands", vocab_size=tokenizers.PIXEL_VOCAB_SIZE if tokens else 0,
                 num_classes=speech_commands.NUM_CLASSES, max_length=length,
                 input_type=cfg.input_type)
    return Task(cfg, info, load)
