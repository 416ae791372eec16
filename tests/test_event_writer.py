"""The TensorBoard event writer (`sptlib.train.metrics.EventWriter`, no TensorFlow): its files
are read back by TensorBoard's own reader, which checks every record's CRC."""

import pathlib
import subprocess
import sys

from sptlib.train import metrics


def _scalars(path):
    """{tag: [(step, value)]} as TensorBoard's event reader sees the file (CRCs checked)."""
    from tensorboard.backend.event_processing import event_file_loader
    out = {}
    for event in event_file_loader.EventFileLoader(str(path)).Load():
        for v in event.summary.value:
            value = v.simple_value if v.HasField("simple_value") else \
                float(v.tensor.float_val[0])
            out.setdefault(v.tag, []).append((event.step, value))
    return out


def test_local_event_file_reads_back_in_tensorboard(tmp_path):
    w = metrics.create_writer(tmp_path / "stage", is_main=True)
    w.write_scalars(10, {"train/loss": 2.5, "train/accuracy": 0.25})
    w.write_scalars(20, {"train/loss": 1.25})
    # Appended on every write: readable before close (a crashed run keeps its curves).
    assert _scalars(w.path)["train/loss"] == [(10, 2.5), (20, 1.25)]
    w.write_scalars(30, {"validation/accuracy": 0.75})
    w.close()
    files = list((tmp_path / "stage").glob("events.out.tfevents.*"))
    assert files == [pathlib.Path(w.path)]
    got = _scalars(files[0])
    assert got == {"train/loss": [(10, 2.5), (20, 1.25)], "train/accuracy": [(10, 0.25)],
                   "validation/accuracy": [(30, 0.75)]}


def test_other_processes_write_nothing(tmp_path):
    w = metrics.create_writer(tmp_path / "stage", is_main=False)
    w.write_scalars(1, {"train/loss": 1.0})
    w.close()
    assert not (tmp_path / "stage").exists()


def test_gs_logdir_rewrites_the_whole_object(tmp_path):
    """An object store cannot append: the file is rewritten (through epath) on flush/close."""
    from tests.test_gcs_paths import _fake_gcs
    writes = []
    with _fake_gcs(tmp_path / "gcs", writes, stop_at_first_write=False):
        w = metrics.EventWriter("gs://bucket/run/pretrain", remote_flush_s=3600)
        w.write_scalars(5, {"train/loss": 3.0})
        assert len(writes) == 1  # the file's first event only: no flush before the hour
        w.close()
    assert writes == [str(w.path)] * 2
    local = tmp_path / "gcs" / str(w.path).removeprefix("gs://")
    assert _scalars(local) == {"train/loss": [(5, 3.0)]}


def test_training_imports_no_tensorflow():
    """Training, the comparison, aot, bench, the launchers and the data catalog import
    without TensorFlow, TFDS or TensorBoard (the core install has none of them)."""
    code = ("import sys\n"
            "from sptlib.train import loop, metrics\n"
            "from sptlib.protocol import compare, stages\n"
            "from sptlib.protocol import aot\n"
            "from sptlib.bench import accel, mixers, peers, pipeline, train_step\n"
            "from sptlib.launch import slurm, tpu\n"
            "from sptlib import data\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'tensorflow_datasets', 'clu', 'tensorboard'))\n"
            "assert not bad, bad[:5]\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
