"""The builders of the file-backed tasks: ListOps, retrieval (AAN), Pathfinder / Path-X, Speech Commands.

Each reads its release folder through its reader module (`listops`, `aan`, `pathfinder`,
`speech_commands`: formats, generators, sources), or, with `data.source = "tfds"`, through the
task's TFDS builder (`lra_tfds`, `speech_commands_tfds`), which reuses the same readers. Keeping
the builders here, above both, is what keeps the imports one-way: reader <- TFDS builder <- task.
"""

import logging
import os

from sptlib.data import aan, listops, pathfinder, sources, speech_commands, tokenizers
from sptlib.data.defaults import resolution as task_resolution, sequence_length, task_info
from sptlib.data.release import folder_lock
from sptlib.data.registry import Task, check_tokens, missing_lra_error, register


@register("listops")
def build_listops(cfg):
    """The `listops` Task: the release's TSVs (generated first when missing and allowed) or TFDS."""
    check_tokens(cfg, "listops")
    max_length = sequence_length(cfg)
    gen = cfg.generate
    if not os.path.exists(listops.split_path(cfg.lra_dir, "train")):
        if gen.enabled:
            # Runs sharing the folder take turns: the second finds the first's data.
            with folder_lock(cfg.lra_dir, listops.FOLDER):
                if not os.path.exists(listops.split_path(cfg.lra_dir, "train")):
                    logging.info("ListOps: generating %d/%d/%d examples in %s", gen.num_train,
                                 gen.num_val, gen.num_test, cfg.lra_dir)
                    listops.generate_release(
                        cfg.lra_dir, num_train=gen.num_train, num_val=gen.num_val,
                        num_test=gen.num_test, seed=gen.seed, min_length=gen.min_length,
                        max_length=gen.max_length)
        else:
            raise missing_lra_error(
                cfg.lra_dir, f"{listops.FOLDER}/basic_train.tsv", "listops",
                f"python -m sptlib.data listops --out {cfg.lra_dir} --num_train 96000 "
                f"--num_val 2000 --num_test 2000 --seed 0")

    if cfg.source == "tfds":
        # Deferred: TFDS (TensorFlow) loads only for source='tfds'; lra_tfds imports the readers.
        from sptlib.data import lra_tfds
        load = lambda split: lra_tfds.listops_source(cfg, split, max_length)  # noqa: E731
    else:
        def load(split):
            seqs, labels = listops.read_split(listops.split_path(cfg.lra_dir, split))
            return sources.TokenSource(seqs, labels, max_length)

    return Task(cfg, task_info(cfg), load)


@register("retrieval")
def build_retrieval(cfg):
    """The `retrieval` Task: pairs of byte-level documents from the release's TSVs, or TFDS."""
    check_tokens(cfg, "retrieval")
    max_length = sequence_length(cfg)
    if not os.path.exists(aan.split_path(cfg.lra_dir, "train")):
        raise missing_lra_error(cfg.lra_dir, f"{aan.FOLDER}/{aan.SPLIT_FILES['train']}",
                                "retrieval")
    if cfg.source == "tfds":
        # Deferred: TFDS (TensorFlow) loads only for source='tfds'; lra_tfds imports the readers.
        from sptlib.data import lra_tfds
        load = lambda split: lra_tfds.retrieval_source(cfg, split, max_length)  # noqa: E731
    else:
        def load(split):
            d1, d2, labels = aan.read_split(aan.split_path(cfg.lra_dir, split))
            return sources.PairTokenSource(d1, d2, labels, max_length,
                                           id_offset=tokenizers.vocab.NUM_SPECIAL)
    return Task(cfg, task_info(cfg), load)


@register("pathfinder", "pathx", "pathx256")
def build_pathfinder(cfg):
    """The Pathfinder-family Task: the release's PNGs (generated when missing and allowed)."""
    res = task_resolution(cfg)
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
            parent, name = os.path.split(os.path.abspath(folder))
            with folder_lock(parent, name):  # runs sharing the folder take turns
                if not os.path.isdir(os.path.join(folder, "metadata")):
                    logging.info("Pathfinder: generating %d images at %d px in %s", num, res,
                                 cfg.lra_dir)
                    # Validation and test images from a seed never used for training images.
                    pathfinder.generate_release(
                        cfg.lra_dir, resolution=res, num=num, seed=gen.seed,
                        contour_length=contour, held_out_from=pathfinder.train_size(num))
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
            # Deferred: TFDS (TensorFlow) loads only for source='tfds'; lra_tfds imports the
            # readers.
            from sptlib.data import lra_tfds
            return lra_tfds.pathfinder_source(cfg, split, res, difficulty)
        if "index" not in state:
            state["index"] = pathfinder.read_index(folder)
        entries, empty = state["index"]
        return pathfinder.PathfinderSource(pathfinder.split_entries(entries, split), res,
                                           cfg.input_type, num_empty=empty)

    return Task(cfg, task_info(cfg), load)


@register("speech_commands")
def build_speech_commands(cfg):
    """The `speech_commands` Task (SC35) from the raw v0.02 release, or its TFDS copy."""
    length = sequence_length(cfg)
    root = cfg.speech_commands_dir
    speech_commands.check_root(root)  # a missing or partial release fails before training
    if cfg.source == "tfds":
        # Deferred: TFDS (TensorFlow) loads only for source='tfds'; speech_commands_tfds
        # imports the reader.
        from sptlib.data import speech_commands_tfds
        load = lambda split: speech_commands_tfds.source(cfg, split, length)  # noqa: E731
    else:
        def load(split):
            return speech_commands.SpeechCommandsSource(
                root, speech_commands.list_split(root, split), length, cfg.input_type)
    return Task(cfg, task_info(cfg), load)
