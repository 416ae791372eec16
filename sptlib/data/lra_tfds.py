"""TFDS builders for the LRA release files (ArrayRecord output, random-access reading).

The release cannot be downloaded by TFDS (it is one 7 GB archive), so each builder is a
`GeneratorBasedBuilder` with `MANUAL_DOWNLOAD_INSTRUCTIONS`: its manual dir is `lra_dir`. The
examples come from the same readers as `source='files'` (so the same validation and errors), and
are written once as ArrayRecord under `tfds_data_dir`, in file order (disable_shuffling, so both
sources give identical splits and batches); training then reads them with
`builder.as_data_source(split)`:

    cfg.source = 'tfds'   # in config.data; prepared on first use
"""

import inspect

import numpy as np
from etils import epath

from sptlib.data import aan, listops, pathfinder, sources, tokenizers

# Imported only for config.data.source='tfds' (file_tasks defers it); a one-line error without.
tfds = sources.import_tfds("config.data.source='tfds' (the LRA TFDS builders)")

_INSTRUCTIONS = """
Download and extract the LRA release (https://storage.googleapis.com/long-range-arena/
lra_release.gz) or generate the files with `python -m sptlib.data listops|pathfinder --out DIR`,
and pass the folder that holds listops-1000/, tsv_data/, pathfinder32/ ... as the manual dir
(config.data.lra_dir).
"""
_SPLITS = ("train", "validation", "test")


class _Builder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Base: locates the builder's code with `inspect` (TFDS's default path lookup needs the
    `importlib_resources` backport, which the pinned environment does not install)."""

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
        return epath.Path(inspect.getfile(cls))


class LraListops(_Builder):
    """LRA ListOps (`listops-1000/basic_*.tsv`)."""

    VERSION = tfds.core.Version("1.0.0")
    MANUAL_DOWNLOAD_INSTRUCTIONS = _INSTRUCTIONS

    def _info(self):
        return self.dataset_info_from_configs(disable_shuffling=True, features=tfds.features.FeaturesDict({
            "tokens": tfds.features.Tensor(shape=(None,), dtype=np.uint8),
            "label": tfds.features.ClassLabel(num_classes=10)}))

    def _split_generators(self, dl_manager):
        root = str(dl_manager.manual_dir)
        return {s: self._generate_examples(listops.split_path(root, s)) for s in _SPLITS}

    def _generate_examples(self, path):
        seqs, labels = listops.read_split(path)
        for i, (s, y) in enumerate(zip(seqs, labels)):
            yield i, {"tokens": s.astype(np.uint8), "label": int(y)}


class LraRetrieval(_Builder):
    """LRA AAN retrieval (`tsv_data/new_aan_pairs.*.tsv`), documents as raw bytes."""

    VERSION = tfds.core.Version("1.0.0")
    MANUAL_DOWNLOAD_INSTRUCTIONS = _INSTRUCTIONS

    def _info(self):
        return self.dataset_info_from_configs(disable_shuffling=True, features=tfds.features.FeaturesDict({
            "text1": tfds.features.Tensor(shape=(None,), dtype=np.uint8),
            "text2": tfds.features.Tensor(shape=(None,), dtype=np.uint8),
            "label": tfds.features.ClassLabel(num_classes=2)}))

    def _split_generators(self, dl_manager):
        root = str(dl_manager.manual_dir)
        return {s: self._generate_examples(aan.split_path(root, s)) for s in _SPLITS}

    def _generate_examples(self, path):
        d1, d2, labels = aan.read_split(path)
        for i in range(len(labels)):
            yield i, {"text1": d1[i], "text2": d2[i], "label": int(labels[i])}


class LraPathfinderConfig(tfds.core.BuilderConfig):
    def __init__(self, *, resolution, difficulty, **kwargs):
        super().__init__(name=f"{resolution}_{difficulty}", **kwargs)
        self.resolution = resolution
        self.difficulty = difficulty


class LraPathfinder(_Builder):
    """LRA Pathfinder / PathX PNGs, split 80/10/10 in metadata order (empty PNGs skipped)."""

    VERSION = tfds.core.Version("1.0.0")
    MANUAL_DOWNLOAD_INSTRUCTIONS = _INSTRUCTIONS
    BUILDER_CONFIGS = [LraPathfinderConfig(resolution=r, difficulty=d)
                       for r in (32, 64, 128, 256) for d in pathfinder.DIFFICULTIES.values()]

    def _info(self):
        r = self.builder_config.resolution
        return self.dataset_info_from_configs(disable_shuffling=True, features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(r, r, 1), encoding_format="png"),
            "label": tfds.features.ClassLabel(num_classes=2)}))

    def _split_generators(self, dl_manager):
        c = self.builder_config
        folder = pathfinder.folder_path(str(dl_manager.manual_dir), c.resolution, c.difficulty)
        entries, _ = pathfinder.read_index(folder)
        return {s: self._generate_examples(pathfinder.split_entries(entries, s))
                for s in _SPLITS}

    def _generate_examples(self, entries):
        r = self.builder_config.resolution
        for path, label, meta, line in entries:
            img = pathfinder.load_png(path, r, f" (listed at {meta}:{line})")
            yield path, {"image": img[..., None], "label": label}


def _prepared(builder_cls, cfg, **kwargs):
    kw = {"data_dir": cfg.tfds_data_dir} if cfg.tfds_data_dir else {}
    builder = builder_cls(file_format="array_record", **kw, **kwargs)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=cfg.lra_dir))
    return builder


def listops_source(cfg, split, max_length):
    records = _prepared(LraListops, cfg).as_data_source(split)

    def decode(rec):
        ids = np.asarray(rec["tokens"], np.int32)[:max_length]
        inputs, mask = sources.pad_tokens(ids, max_length)
        return {"inputs": inputs, "mask": mask, "label": np.int32(rec["label"])}

    src = sources.MappedSource(records, decode,
                               lambda: _drop_example_mask(sources.TokenSource([], [], max_length)))
    src.num_truncated = sum(len(records[i]["tokens"]) > max_length for i in range(len(records)))
    return src


def retrieval_source(cfg, split, max_length):
    records = _prepared(LraRetrieval, cfg).as_data_source(split)

    def decode(rec):
        a, ma = sources.pad_tokens(tokenizers.byte_tokens(rec["text1"][:max_length].tobytes()),
                                    max_length)
        b, mb = sources.pad_tokens(tokenizers.byte_tokens(rec["text2"][:max_length].tobytes()),
                                    max_length)
        return {"inputs": a, "mask": ma, "inputs2": b, "mask2": mb,
                "label": np.int32(rec["label"])}

    return sources.MappedSource(records, decode, lambda: _drop_example_mask(
        sources.PairTokenSource([], [], [], max_length)))


def pathfinder_source(cfg, split, resolution, difficulty):
    builder = _prepared(LraPathfinder, cfg, config=f"{resolution}_{difficulty}")
    records = builder.as_data_source(split)

    def decode(rec):
        ex = sources.encode_values(np.asarray(rec["image"]).reshape(-1, 1), cfg.input_type)
        ex["label"] = np.int32(rec["label"])
        return ex

    def filler():
        ex = sources.filler_values(cfg.input_type, resolution * resolution, 1)
        ex["label"] = np.int32(0)
        return ex

    return sources.MappedSource(records, decode, filler)


def _drop_example_mask(src):
    ex = src.filler()
    ex.pop("example_mask")
    return ex
