"""TFDS builder for SC35 over the raw Speech Commands v0.02 release (`manual_dir`).

TFDS's own `speech_commands` has 12 classes (10 words, silence, unknown); the paper uses all 35
words. `SpeechCommands35` writes the raw release (`config.data.speech_commands_dir`, the manual
dir) once as ArrayRecord under `tfds_data_dir`, through the same reader as `source='files'`
(same splits, order and errors), and training reads it with random access:

    cfg.task = 'speech_commands'; cfg.source = 'tfds'   # prepared on first use
"""

import os

import numpy as np

from sptlib.data import sources
from sptlib.data import speech_commands as sc
from sptlib.data.lra_tfds import _Builder

# Imported only for config.data.source='tfds' (file_tasks defers it); a one-line error without.
tfds = sources.import_tfds("config.data.source='tfds' (the Speech Commands TFDS builder)")

_INSTRUCTIONS = f"""
Download {sc.URL}, extract it into a folder (it holds one folder per word,
validation_list.txt and testing_list.txt) and pass that folder as the manual dir
(config.data.speech_commands_dir).
"""


class SpeechCommands35(_Builder):
    """Speech Commands v0.02, 35 words, 16 kHz int16 waveforms of at most 1 s."""

    VERSION = tfds.core.Version("1.0.0")
    MANUAL_DOWNLOAD_INSTRUCTIONS = _INSTRUCTIONS

    def _info(self):
        return self.dataset_info_from_configs(
            disable_shuffling=True, features=tfds.features.FeaturesDict({
                "audio": tfds.features.Tensor(shape=(None,), dtype=np.int16),
                "label": tfds.features.ClassLabel(names=list(sc.WORDS))}))

    def _split_generators(self, dl_manager):
        root = str(dl_manager.manual_dir)
        return {s: self._generate_examples(root, sc.list_split(root, s))
                for s in ("train", "validation", "test")}

    def _generate_examples(self, root, entries):
        for rel, label in entries:
            yield rel, {"audio": sc.read_wav(os.path.join(root, rel)), "label": label}


def source(cfg, split, length):
    """The prepared split as a random-access source of examples (`sources.MappedSource`)."""
    kw = {"data_dir": cfg.tfds_data_dir} if cfg.tfds_data_dir else {}
    builder = SpeechCommands35(file_format="array_record", **kw)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=cfg.speech_commands_dir))

    def decode(rec):
        ex = sc.encode_audio(np.asarray(rec["audio"]), length, cfg.input_type)
        ex["label"] = np.int32(rec["label"])
        return ex

    return sources.MappedSource(builder.as_data_source(split), decode,
                                lambda: sc.filler(cfg.input_type, length))
