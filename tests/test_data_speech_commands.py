"""SC35: the raw Speech Commands v0.02 reader and the TFDS builder over the same layout, on a
generated fixture (35 word folders of tiny WAVs written with the `wave` module), and the
Speech Commands presets' 35-way heads."""

import os
import wave

import numpy as np
import pytest

from sptlib.data import data_config, get_task
from sptlib.data import speech_commands as sc
from sptlib.data.errors import DataError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The 35 words of v0.02, written out here (not taken from the module under test).
WORDS_V2 = sorted(
    "yes no up down left right on off stop go zero one two three four five six seven eight nine "
    "bed bird cat dog happy house marvin sheila tree wow backward forward follow learn visual"
    .split())


def write_wav(path, samples, rate=16000, channels=1):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.asarray(samples, "<i2").tobytes())


def clip(word_index, k):
    """Samples of clip k of word i: length 20 + 7k, values identifying the clip."""
    n = 20 + 7 * k
    return (np.arange(n) * 100 + word_index * 1000 + k).astype(np.int16)


@pytest.fixture
def release(tmp_path):
    """35 word folders x 3 clips; clip 0 of every word in validation, clip 1 of even words in
    test; a background-noise folder that must be skipped."""
    root = tmp_path / "speech_commands_v0.02"
    for i, word in enumerate(WORDS_V2):
        (root / word).mkdir(parents=True)
        for k in range(3):
            write_wav(root / word / f"spk{k}_nohash_0.wav", clip(i, k))
    (root / "_background_noise_").mkdir()
    write_wav(root / "_background_noise_" / "white_noise.wav", np.zeros(32000))
    (root / "validation_list.txt").write_text(
        "".join(f"{w}/spk0_nohash_0.wav\n" for w in WORDS_V2))
    (root / "testing_list.txt").write_text(
        "".join(f"{w}/spk1_nohash_0.wav\n" for w in WORDS_V2[::2]))
    return root


def sc_task(root, **kw):
    cfg = data_config()
    cfg.update(dict(dict(task="speech_commands", speech_commands_dir=str(root),
                         input_type="continuous"), **kw))
    return get_task(cfg)


def test_reader_counts_35_classes_and_splits_by_the_lists(release):
    task = sc_task(release)
    assert task.info["num_classes"] == 35 and task.info["max_length"] == 16000
    assert list(sc.WORDS) == WORDS_V2
    # 105 clips: 35 validation, 18 test (even words), the other 52 train; noise skipped.
    sizes = {s: task.num_examples(s) for s in ("train", "validation", "test")}
    assert sizes == {"train": 52, "validation": 35, "test": 18}
    labels = set()
    for split in ("train", "validation", "test"):
        for ex in (task.source(split)[i] for i in range(sizes[split])):
            labels.add(int(ex["label"]))
    assert labels == set(range(35))


def test_examples_carry_the_waveform(release):
    task = sc_task(release)
    src = task.source("validation")  # list order: clip 0 of each word, alphabetically
    i = WORDS_V2.index("marvin")
    ex = src[i]
    want = clip(i, 0)
    assert int(ex["label"]) == i and ex["inputs"].shape == (16000, 1)
    assert ex["mask"].sum() == len(want) and not ex["mask"][len(want):].any()
    np.testing.assert_allclose(ex["inputs"][:len(want), 0], want / 32768.0)
    assert not ex["inputs"][len(want):].any()
    # mu-law by hand: 0 -> the middle code 128; the loudest samples -> 0 and 255.
    codes = sc.encode_audio(np.array([0, -32768, 32767], np.int16), 4, "continuous")["raw"]
    assert codes[:, 0].tolist() == [128, 0, 255, 0]
    tok = sc_task(release, input_type="tokens").source("validation")[i]
    assert tok["inputs"].shape == (16000,)
    np.testing.assert_array_equal(tok["inputs"][:len(want)], ex["raw"][:len(want), 0] + 2)
    b = next(task.make_iterator("train", batch_size=4, seed=0))
    assert b["inputs"].shape == (4, 16000, 1) and b["raw"].shape == (4, 16000, 1)


def test_bad_release_files_are_named(release):
    bad = release / "cat" / "spk2_nohash_0.wav"
    bad.write_bytes(b"RIFF\x00\x00garbage")
    src = sc_task(release).source("train")
    idx = next(i for i, (rel, _) in enumerate(src.entries) if rel == "cat/spk2_nohash_0.wav")
    with pytest.raises(DataError, match="not a readable WAV") as e:
        src[idx]
    assert str(bad) in str(e.value)
    write_wav(bad, np.zeros(10), rate=8000)
    with pytest.raises(DataError, match="expected 16 kHz mono 16-bit PCM, got 8000 Hz"):
        src[idx]

    with open(release / "testing_list.txt", "a") as f:
        f.write("dog/nobody_nohash_9.wav\n")
    with pytest.raises(DataError, match="names dog/nobody_nohash_9.wav, which does not exist") \
            as e:
        sc.list_split(str(release), "test")
    assert f"{release / 'testing_list.txt'}:19:" in str(e.value)


def test_missing_or_partial_release_is_a_clear_error(release, tmp_path):
    with pytest.raises(DataError, match="speech_commands_v0.02.tar.gz"):
        sc_task(tmp_path / "nowhere")
    (release / "visual").rename(release / "visual_old")
    with pytest.raises(DataError, match=r"missing word folders \['visual'\], unknown folders "
                                        r"\['visual_old'\]"):
        sc_task(release)


def test_tfds_builder_matches_the_reader(release, tmp_path):
    pytest.importorskip("tensorflow_datasets")
    batches = {}
    for source in ("files", "tfds"):
        task = sc_task(release, source=source, tfds_data_dir=str(tmp_path / "tfds"))
        assert task.info["num_classes"] == 35
        assert {s: task.num_examples(s) for s in ("train", "validation", "test")} == {
            "train": 52, "validation": 35, "test": 18}
        batches[source] = [next(task.make_iterator(s, batch_size=8, seed=0, num_epochs=1))
                           for s in ("train", "test")]
    for a, b in zip(*batches.values()):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_speech_commands_presets_build_35_way_heads(release):
    """The paper configs, given the fixture release, classify into 35 words."""
    import jax
    import jax.numpy as jnp

    from sptlib.configs import common
    from sptlib import models, objectives

    module = common.load_module(os.path.join(ROOT, "experiments", "speech_commands.py"))
    for model in ("transformer", "s4"):
        cfg = module.get_config(f"{model},scratch")
        with cfg.unlocked():
            cfg.data.speech_commands_dir = str(release)
        info = get_task(cfg.data).info
        obj = objectives.make_objective(cfg.stages.scratch.objective, info, cfg.model)
        net = models.build_model(cfg.model, obj.head_cfg)
        # Continuous inputs plus the mask-indicator channel the objectives append.
        x, mask = jnp.zeros((2, 256, 2)), jnp.ones((2, 256), bool)
        out = jax.eval_shape(lambda: net.init_with_output(jax.random.key(0), x, mask)[0])
        assert out.shape == (2, 35), (model, out.shape)
