"""Speech Commands v0.02 with all 35 words (SC35, as in the SPT and S4 papers), raw release layout.

The release (`speech_commands_v0.02.tar.gz`, Warden 2018) extracts to one folder:

    <root>/<word>/<speaker>_nohash_<n>.wav   16 kHz mono 16-bit PCM clips of at most 1 s
    <root>/_background_noise_/*.wav          long noise recordings: not examples, skipped
    <root>/validation_list.txt               one `<word>/<file>.wav` per line
    <root>/testing_list.txt                  likewise

Validation and test are the listed files; train is every other clip of the 35 word folders
(84,843 / 9,981 / 11,005 clips). Labels index `WORDS` (alphabetical). Clips are decoded on access;
an example is the waveform as `inputs` float32 `[length, 1]` (samples / 32768) with `raw` its
8-bit mu-law codes, or the codes as tokens; shorter clips are padded (mask False).
"""

import os
import wave

import numpy as np

from sptlib.data import sources, tokenizers
from sptlib.data.errors import DataError, located

WORDS = tuple(sorted((
    "backward", "bed", "bird", "cat", "dog", "down", "eight", "five", "follow", "forward",
    "four", "go", "happy", "house", "learn", "left", "marvin", "nine", "no", "off", "on", "one",
    "right", "seven", "sheila", "six", "stop", "three", "tree", "two", "up", "visual", "wow",
    "yes", "zero")))
NUM_CLASSES = len(WORDS)  # 35
SAMPLE_RATE = 16000
LENGTH = SAMPLE_RATE  # one second
SPLIT_FILES = {"validation": "validation_list.txt", "test": "testing_list.txt"}
URL = "http://download.tensorflow.org/data/speech_commands_v0.02.tar.gz"


def check_root(root):
    """Raises DataError unless `root` holds the 35 word folders and both split lists."""
    if not os.path.isdir(root):
        raise DataError(
            f"speech_commands: expected the Speech Commands v0.02 release at {root!r}, not found. "
            f"Download {URL}, extract it into a folder and set config.data.speech_commands_dir "
            "to it (see docs/data.md).")
    folders = {d for d in os.listdir(root)
               if os.path.isdir(os.path.join(root, d)) and not d.startswith(("_", "."))}
    missing, unknown = sorted(set(WORDS) - folders), sorted(folders - set(WORDS))
    if missing or unknown:
        raise DataError(
            f"{root}: not the 35-word Speech Commands v0.02 layout: missing word folders "
            f"{missing}, unknown folders {unknown} (v0.01 has 30 words; SC35 needs v0.02)")
    for fname in SPLIT_FILES.values():
        if not os.path.isfile(os.path.join(root, fname)):
            raise DataError(f"{os.path.join(root, fname)}: split list not found (part of the "
                            "v0.02 release)")


def _read_list(root, fname):
    """`[(relative path, label)]` of a split list, in file order; every entry checked."""
    path = os.path.join(root, fname)
    out = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            rel = line.strip()
            if not rel:
                continue
            word = rel.split("/", 1)[0]
            if "/" not in rel or word not in WORDS:
                raise located(path, line_no, f"{rel!r} is not <word>/<file>.wav with one of the "
                                             f"{NUM_CLASSES} words")
            if not os.path.isfile(os.path.join(root, rel)):
                raise located(path, line_no, f"names {rel}, which does not exist under {root}")
            out.append((rel, WORDS.index(word)))
    return out


def list_split(root, split):
    """`[(relative path, label)]` of one split: validation/test in list order, train sorted."""
    check_root(root)
    if split in SPLIT_FILES:
        return _read_list(root, SPLIT_FILES[split])
    if split != "train":
        raise ValueError(f"unknown split {split!r}; expected train, validation or test")
    held_out = {rel for f in SPLIT_FILES.values() for rel, _ in _read_list(root, f)}
    out = []
    for label, word in enumerate(WORDS):
        for name in sorted(os.listdir(os.path.join(root, word))):
            rel = f"{word}/{name}"
            if name.endswith(".wav") and rel not in held_out:
                out.append((rel, label))
    return out


def read_wav(path):
    """16 kHz mono 16-bit PCM WAV -> int16 samples `[n]`; DataError naming the file otherwise."""
    try:
        with wave.open(path, "rb") as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            n = w.getnframes()
            frames = w.readframes(n)
    except (wave.Error, EOFError, OSError) as e:
        raise DataError(f"{path}: not a readable WAV file ({type(e).__name__}: {e})") from e
    if (channels, width, rate) != (1, 2, SAMPLE_RATE):
        raise DataError(f"{path}: expected 16 kHz mono 16-bit PCM, got {rate} Hz, {channels} "
                        f"channel(s), {8 * width}-bit samples")
    if len(frames) != 2 * n:
        raise DataError(f"{path}: truncated WAV ({len(frames) // 2} of {n} samples present)")
    return np.frombuffer(frames, "<i2")


def encode_audio(samples, length, input_type):
    """int16 samples `[n]` -> `inputs`, `mask` (+ `raw`) of one example, padded/cut to length.

    continuous: `inputs` float32 `[length, 1]` = samples / 32768, `raw` int32 `[length, 1]` the
    8-bit mu-law codes; tokens: `inputs` int32 `[length]` = code + 2.
    """
    audio = np.asarray(samples, np.float32)[:length] / 32768.0
    codes = tokenizers.mu_law_encode(audio)
    n = len(audio)
    ex = sources.filler_values(input_type, length, 1)
    ex["mask"][:n] = True
    if input_type == "tokens":
        ex["inputs"][:n] = codes + tokenizers.vocab.NUM_SPECIAL
    else:
        ex["inputs"][:n, 0] = audio
        ex["raw"][:n, 0] = codes
    return ex


def filler(input_type, length):
    """The all-padding example (completes the last evaluation batch)."""
    ex = sources.filler_values(input_type, length, 1)
    ex["label"] = np.int32(0)
    return ex


class SpeechCommandsSource:
    """Clips of one split, decoded on access (picklable: grain workers)."""

    def __init__(self, root, entries, length, input_type):
        self.root, self.entries = root, list(entries)
        self.length, self.input_type = length, input_type
        self.num_truncated = 0  # release clips are at most 1 s = the default length

    def __len__(self):
        return len(self.entries)

    def __getitem__(self, i):
        rel, label = self.entries[i]
        ex = encode_audio(read_wav(os.path.join(self.root, rel)), self.length, self.input_type)
        ex.update(label=np.int32(label), example_mask=np.bool_(True))
        return ex

    def filler(self):
        ex = filler(self.input_type, self.length)
        ex["example_mask"] = np.bool_(False)
        return ex
