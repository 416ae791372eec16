"""gs:// workdirs: path handling up to the first write, with the file system swapped for a local one.

`etils.epath.testing.mock_epath` replaces every epath backend (gs:// included) with functions
that map `gs://BUCKET/...` to `<tmp>/gcs/BUCKET/...` on the local disk; nothing reaches a network.
The engine's first write into a `gs://` workdir must arrive there through epath (not `open()` /
`os.makedirs`, which would create a local directory literally named `gs:`).
"""

import contextlib
import pathlib
from unittest import mock

import pytest
from etils import epath
from etils.epath import gpath
from etils.epath import testing as epath_testing

from sptlib.launch import common

BUCKET_RUN = "gs://spt-test-bucket/runs/smoke"


class _FirstWrite(Exception):
    """Raised by the fake file system at the first file opened for writing on gs://."""


def _fake_gcs(root: pathlib.Path, writes: list, stop_at_first_write: bool = True):
    """mock_epath functions: gs:// paths go to `root`; the first write on gs:// stops the run
    (unless `stop_at_first_write=False`: then writes are recorded and land under `root`)."""

    def local(path):
        p = str(path)
        return str(root / p[len("gs://"):]) if p.startswith("gs://") else p

    def passthrough(fn, path, *args, **kwargs):
        return fn(local(path), *args, **kwargs)

    def open_(fn, path, mode="r", *args, **kwargs):
        if str(path).startswith("gs://") and any(c in mode for c in "wax+"):
            writes.append(str(path))
            if stop_at_first_write:
                raise _FirstWrite(str(path))
        return fn(local(path), mode, *args, **kwargs)

    def two_paths(fn, path, dst, *args, **kwargs):
        return fn(local(path), local(dst), *args, **kwargs)

    names = ("exists", "glob", "isdir", "listdir", "makedirs", "mkdir", "remove", "rmtree",
             "stat", "walk")
    fns = {n: passthrough for n in names}
    fns.update(open=open_, rename=two_paths, replace=two_paths, copy=two_paths)
    stack = contextlib.ExitStack()
    stack.enter_context(epath_testing.mock_epath(**fns))
    # etils 1.15 picks its TensorFlow gfile backend for gs:// whenever TF is importable, past
    # mock_epath's backend table; make it use the table (i.e. the mock).
    stack.enter_context(mock.patch.object(gpath, "_is_tf_installed", lambda: False))
    return stack


def test_fake_gcs_maps_bucket_paths_to_local_dir(tmp_path):
    writes = []
    with _fake_gcs(tmp_path / "gcs", writes):
        d = epath.Path(BUCKET_RUN) / "a"
        d.mkdir(parents=True)
        assert d.exists() and d.is_dir()
        with pytest.raises(_FirstWrite):
            (d / "f.txt").write_text("x")
    assert (tmp_path / "gcs/spt-test-bucket/runs/smoke/a").is_dir()
    assert writes == [BUCKET_RUN + "/a/f.txt"]


def test_pipeline_reaches_first_write_on_gs_workdir(tmp_path, monkeypatch):
    """`sptlib.protocol.stages.run(config, "gs://...")` creates the stage dir and writes its first file
    through epath. Stops there: later writes (orbax/TensorStore, the TensorBoard event file)
    use their own gs clients, which this test must not reach."""
    from sptlib.experiments import smoke  # the repo root is on sys.path (tests/conftest.py)
    from sptlib.protocol import stages
    config = smoke.get_config()
    # The data lives outside cwd: preflight generates it (a local path) before the first write.
    config.data.lra_dir = str(tmp_path / "lra")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    writes = []
    with _fake_gcs(tmp_path / "gcs", writes), pytest.raises(_FirstWrite):
        stages.run(config, BUCKET_RUN)
    first_stage = config.stage_order[0]
    assert writes, "no write reached the gs:// file system"
    assert writes[0].startswith(f"{BUCKET_RUN}/{first_stage}/"), writes
    assert (tmp_path / "gcs/spt-test-bucket/runs/smoke" / first_stage).is_dir()
    # Nothing treated the URL as a local path (that would create ./gs:/...).
    assert list(cwd.iterdir()) == []


def test_launch_workdir_checks():
    assert common.check_workdir("gs://my-bucket/spt/run/", multi_host=True) == \
        "gs://my-bucket/spt/run"
    with pytest.raises(ValueError, match="not on gs://"):
        common.check_workdir("/home/me/run", multi_host=True)
    assert common.check_workdir("/mnt/gcs/run", multi_host=True, allow_local=True) == \
        "/mnt/gcs/run"
    assert common.check_workdir("/shared/run", multi_host=False) == "/shared/run"
    with pytest.raises(ValueError, match="not a valid"):
        common.check_workdir("gs://Bad_Bucket!/x", multi_host=True)


def test_compare_writes_its_records_report_and_plots_through_epath(tmp_path, monkeypatch):
    """`sptlib.protocol.compare` on a gs:// workdir: runs, resume checks, comparison.json/.md and the PNGs
    all go through epath (a fake trainer writes the stage results the same way)."""
    import json
    from sptlib.protocol import compare

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    root = "gs://spt-test-bucket/cmp"
    calls = []

    def fake_run(config, workdir):
        calls.append(workdir)
        acc = (0.9 if config.model.mixer == "s4d" else 0.6) + 0.01 * config.seed
        for stage in config.stage_order:
            res = {"stage": stage, "status": "finished",
                   "final_step": config.stages[stage].num_steps, "best_step": 1,
                   "validation": {"best": {"accuracy": acc}}, "test": {"best": {"accuracy": acc}},
                   "wall_time_s": 1.0, "history": [{"step": 1, "accuracy": acc}]}
            d = epath.Path(workdir) / stage
            d.mkdir(parents=True, exist_ok=True)
            (d / "results.json").write_text(json.dumps(res))
        return {}

    path = str(pathlib.Path(__file__).parent.parent / "experiments" / "quickstart.py")
    writes = []
    with _fake_gcs(tmp_path / "gcs", writes, stop_at_first_write=False):
        _, specs = compare.expand(path, {}, workdir=root, seeds=[0, 1])
        records, paths = compare.run_comparison(specs, root, run_fn=fake_run,
                                                log=lambda s: None)
        assert len(calls) == 12 and all(r["status"] == "finished" for r in records)
        again = []
        compare.run_comparison(specs, root, run_fn=lambda c, w: again.append(w),
                               log=lambda s: None)
        assert again == []  # finished runs are recognised on gs:// too
    local = tmp_path / "gcs/spt-test-bucket/cmp"
    assert json.loads((local / "comparison.json").read_text())[0]["status"] == "finished"
    assert "| s4d |" in (local / "comparison.md").read_text()
    assert (local / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {root + "/comparison.md", root + "/accuracy.png"} <= set(writes)
    assert list(cwd.iterdir()) == []  # nothing treated the URL as a local path
