"""Bad input, as a skeptical user gives it: every row is one input, the exit status it must
produce, a piece of the ONE-line message, and a check that no checkpoint or data file was lost.

Most rows run in-process through `sptlib.protocol.stages.run` (the code path of `sptlib.main`) and map
the raised `SptlibError` to its exit status with `sptlib.errors.exit_code`; the command-line rows
are real subprocesses that check stderr ends in one line and nothing else (no traceback).
"""

import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from sptlib.experiments import smoke  # the repo root is on sys.path (tests/conftest.py)
from sptlib import errors
from sptlib.protocol import compare, stages
from sptlib.data import listops, pathfinder
from sptlib.data import __main__ as data_cli

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _config(lra, **stage):
    c = smoke.get_config()
    c.data.lra_dir = str(lra)
    c.data.max_length = 64
    c.model.d_model = 16
    c.stage_order = ("scratch",)
    s = c.stages.scratch
    s.num_steps, s.eval_every, s.checkpoint_every, s.log_every = 4, 2, 2, 2
    s.batch_size, s.eval_batch_size = 8, 16
    s.update(stage)
    return c



@pytest.fixture(scope="module")
def finished(lra, tmp_path_factory):
    """A finished tiny run (scratch, 4 steps, checkpoints at 2 and 4): copied by each row."""
    wd = tmp_path_factory.mktemp("finished") / "run"
    stages.run(_config(lra), str(wd))
    return wd


def snapshot(*roots):
    """{path: sha1} of every file under `roots`: what must survive a rejected input."""
    out = {}
    for root in roots:
        for p in pathlib.Path(root).rglob("*"):
            if p.is_file():
                out[str(p)] = hashlib.sha1(p.read_bytes()).hexdigest()
    return out


def assert_nothing_lost(before, *roots):
    after = snapshot(*roots)
    lost = {p for p in before if after.get(p) != before[p]}
    assert not lost, f"files lost, moved or changed: {sorted(lost)[:5]}"


def _damage(lra_dir, split, text):
    (pathlib.Path(lra_dir) / listops.FOLDER / listops.SPLIT_FILES[split]).write_text(text)


HEADER = "Source\tTarget\n"


def _spoil(split, text):
    def make(lra, tmp):
        _damage(lra, split, text)
        return _config(lra), tmp / "wd"
    return make


def _stage(**stage):
    return lambda lra, tmp: (_config(lra, **stage), tmp / "wd")


def _pretrain(**objective):
    def make(lra, tmp):
        c = _config(lra)
        c.stage_order = ("pretrain",)
        c.stages.pretrain.objective.update(objective)
        return c, tmp / "wd"
    return make


def _data(**data):
    def make(lra, tmp):
        c = _config(lra)
        c.data.update(data)
        return c, tmp / "wd"
    return make


def _file_workdir(sub=""):
    def make(lra, tmp):
        (tmp / "f").write_text("x")
        return _config(lra), tmp / "f" / sub if sub else tmp / "f"
    return make


def _no_data(lra, tmp):
    c = _config(tmp / "nowhere")
    c.data.generate.enabled = False
    return c, tmp / "wd"


# (id, make(lra copy, tmp) -> (config, workdir), a piece of the one-line message)
IN_PROCESS = [
    ("unknown symbol in validation",
     _spoil("validation", HEADER + "( [MAX 2 3 ] )\t3\n( [MAX 2 X ] )\t2\n"),
     "basic_val.tsv:3: unknown ListOps symbol 'X'"),
    ("header-only test split", _spoil("test", HEADER), "the test split holds no examples"),
    ("empty train file", _spoil("train", ""), "the train split holds no examples"),
    ("unbalanced expression", _spoil("train", HEADER + "( ( [MAX 2 3 ] )\t3\n"),
     "basic_train.tsv:2: unbalanced expression"),
    ("label out of range", _spoil("test", HEADER + "( [MAX 2 3 ] )\t12\n"),
     "basic_test.tsv:2: label 12 outside 0..9"),
    ("best_metric typo", _stage(best_metric="acuracy"),
     "config.stages.scratch.best_metric='acuracy'"),
    ("mask_rate 1.5", _pretrain(mask_rate=1.5),
     "config.stages.pretrain.objective.mask_rate=1.5: must be in (0, 1)"),
    ("mask_rate -0.1", _pretrain(mask_rate=-0.1), "mask_rate=-0.1"),
    ("span_length 0", _pretrain(span_length=0), "objective.span_length=0: must be an integer"),
    ("negative eval_batch_size", _stage(eval_batch_size=-4),
     "config.stages.scratch.eval_batch_size must be >= 0"),
    ("zero data fraction", _data(data_fraction=0.0), "config.data: data_fraction must be in"),
    ("workdir is a file", _file_workdir(), "is a file, not a folder"),
    ("workdir under a file", _file_workdir("sub"), "cannot write there"),
    ("missing lra_dir", _no_data, "expected listops-1000/basic_train.tsv under lra_dir="),
    ("unknown task", _data(task="listopz"), "config.data: unknown task 'listopz'"),
    ("negative max_length", _data(max_length=-5), "config.data.max_length=-5: must be >= 0"),
    ("objective kind typo", _pretrain(kind="maskd"),
     "config.stages.pretrain.objective.kind='maskd': expected one of"),
    ("mixer typo", lambda lra, tmp: (_model(_config(lra), mixer="s4dd"), tmp / "wd"),
     "config.model.mixer='s4dd': expected one of"),
    ("d_model 0", lambda lra, tmp: (_model(_config(lra), d_model=0), tmp / "wd"),
     "config.model.d_model=0: must be >= 1"),
    ("negative learning rate", lambda lra, tmp: (_optim(_config(lra), lr=-1.0), tmp / "wd"),
     "config.stages.scratch.optim.lr=-1.0: must be >= 0"),
]


def _model(c, **model):
    c.model.update(model)
    return c


def _optim(c, **optim):
    c.stages.scratch.optim.update(optim)
    return c


@pytest.mark.parametrize("name,make,needle", IN_PROCESS, ids=[r[0] for r in IN_PROCESS])
def test_rejected_before_training(name, make, needle, lra, tmp_path):
    data = tmp_path / "lra"
    shutil.copytree(lra, data)
    config, wd = make(data, tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(errors.SptlibError) as e:
        stages.run(config, str(wd))
    assert errors.exit_code(e.value) == 2
    line = errors.one_line(e.value)
    assert needle in line and "\n" not in line, line
    assert_nothing_lost(before, tmp_path)
    # Nothing was trained: no checkpoint, no stage results anywhere.
    assert not list(tmp_path.rglob("checkpoints")) and not list(tmp_path.rglob("results.json"))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    out = tmp_path_factory.mktemp("pf")
    pathfinder.generate_release(str(out), resolution=8, num=20, seed=0, contour_length=14)
    return out


@pytest.mark.parametrize("damage,needle", [
    ("corrupt", "cannot decode PNG"),
    ("wrong size", "image is (9, 9), expected (8, 8)"),
])
def test_bad_image_in_the_eval_split_is_found_before_training(images, tmp_path, damage,
                                                              needle):
    """The issue: a corrupt or wrong-size PNG of the test split crashed after training."""
    data = tmp_path / "lra"
    shutil.copytree(images, data)
    folder = data / "pathfinder8" / "curv_contour_length_14"
    # Image 18 of 20 is in the test split (the last 10%); its metadata line is 19.
    png = folder / "imgs" / "0" / "sample_18.png"
    if damage == "corrupt":
        png.write_bytes(b"\x89PNG garbage")
    else:
        from PIL import Image
        Image.new("L", (9, 9)).save(png)
    c = _config(data)
    c.data.update(task="pathfinder", resolution=8, difficulty="curv_contour_length_14")
    c.data.generate.enabled = False
    c.model.encoder = "token"
    before = snapshot(tmp_path)
    with pytest.raises(errors.DataError) as e:
        stages.run(c, str(tmp_path / "wd"))
    line = errors.one_line(e.value)
    assert "sample_18.png" in line and needle in line and "0.npy:19" in line, line
    assert_nothing_lost(before, tmp_path)
    assert not list(tmp_path.rglob("checkpoints"))


def test_changed_model_stops_and_keeps_every_checkpoint(finished, lra, tmp_path):
    """The issue's worst case: a changed d_model quarantined healthy checkpoints, then retrained."""
    wd = tmp_path / "run"
    shutil.copytree(finished, wd)
    before = snapshot(wd)
    changed = _config(lra)
    changed.model.d_model = 32
    with pytest.raises(errors.CheckpointMismatchError,
                       match=r"stage 'scratch'.*config\.model\.d_model=16 there, 32 now.*"
                             r"new --workdir"):
        stages.run(changed, str(wd))
    assert_nothing_lost(before, wd)
    # Without the saved config.json to compare, the checkpoint's own tree stops it, naming the
    # parameter and both shapes; still nothing moved (config.json is rewritten by the stage).
    (wd / "scratch" / "config.json").unlink()
    (wd / "scratch" / "results.json").unlink()  # unfinished: it has to restore
    before = snapshot(wd)
    with pytest.raises(errors.CheckpointMismatchError,
                       match=r"stage 'scratch': checkpoint .*/4 does not match this config: "
                             r"'params/[^']+' is \([\d, ]+\) float32 in the checkpoint but "
                             r"\([\d, ]+\) float32 in this config"):
        stages.run(changed, str(wd))
    after = snapshot(wd)
    assert {p for p in before if "checkpoints" in p} <= set(after)
    assert not (wd / "scratch" / "checkpoints" / "corrupt").exists()


def test_all_checkpoints_unreadable_stops_then_starts_over_on_request(finished, lra, tmp_path):
    wd = tmp_path / "run"
    shutil.copytree(finished, wd)
    (wd / "scratch" / "results.json").unlink()
    ck = wd / "scratch" / "checkpoints"
    steps = sorted(p.name for p in ck.iterdir() if p.name.isdigit())
    for s in steps:
        shutil.rmtree(ck / s / "state")
    with pytest.raises(errors.NoReadableCheckpointError,
                       match="start_over_if_unreadable=True"):
        stages.run(_config(lra), str(wd))
    # Moved aside, not deleted: every step's data/ item is still there.
    moved = sorted(p.name.split("-")[0] for p in (ck / "corrupt").iterdir())
    assert moved == steps
    # A second run without the flag still refuses (the folder being empty is not a licence).
    with pytest.raises(errors.NoReadableCheckpointError):
        stages.run(_config(lra), str(wd))
    out = stages.run(_config(lra, start_over_if_unreadable=True), str(wd))
    res = out["stages"]["scratch"]
    assert res.finished and res.init["kind"] == "random"


def test_truncated_stage_results_is_named_and_summary_kept(finished, lra, tmp_path):
    wd = tmp_path / "run"
    shutil.copytree(finished, wd)
    summary = (wd / "results.json").read_text()
    stage = wd / "scratch" / "results.json"
    stage.write_text(stage.read_text()[:40])
    before = snapshot(wd)
    with pytest.raises(errors.ResultsError, match=r"scratch/results\.json is unreadable"):
        stages.run(_config(lra), str(wd))
    assert (wd / "results.json").read_text() == summary
    assert_nothing_lost(before, wd)
    # A truncated summary is kept aside, and rebuilt from the stages' own results.
    stage.unlink()
    (wd / "results.json").write_text(summary[:30])
    out = stages.run(_config(lra), str(wd))
    assert (wd / "results.json.bad").read_text() == summary[:30]
    assert json.loads((wd / "results.json").read_text())["complete"]
    assert out["stages"]["scratch"].init["kind"] == "resume"  # from its step-4 checkpoint


COMPARE_FLAGS = [
    ("seeds", ["a"], int, {"low": 0}, "--seeds=a: 'a' is not an integer"),
    ("seeds", ["-1"], int, {"low": 0}, "--seeds=-1: '-1' must be >= 0"),
    ("length_factors", ["0", "-2"], float, {"low": 0, "low_open": True},
     "--length_factors=0,-2: '0' must be > 0"),
    ("length_factors", ["abc"], float, {"low": 0, "low_open": True}, "'abc' is not a number"),
    ("length_factors", ["nan"], float, {"low": 0, "low_open": True}, "'nan' must be > 0"),
    ("data_fractions", ["1.5"], float, {"low": 0, "high": 1, "low_open": True},
     "'1.5' must be in (0, 1]"),
    ("data_fractions", [], float, {"low": 0, "high": 1}, "--data_fractions= is empty"),
]


@pytest.mark.parametrize("flag,values,kind,bounds,needle", COMPARE_FLAGS)
def test_compare_flags_name_the_flag(flag, values, kind, bounds, needle):
    with pytest.raises(errors.ConfigError) as e:
        compare.parse_numbers(flag, values, kind, **bounds)
    assert needle in str(e.value)


def test_compare_unknown_model_names_the_flag(tmp_path):
    with pytest.raises(errors.ConfigError, match="--models .*model 'nosuch'"):
        compare.expand(str(ROOT / "experiments" / "quickstart.py"), {}, workdir=str(tmp_path),
                       models=["nosuch"])


@pytest.mark.parametrize("text", ["2/2", "a/b", "1", "-1/3", "0/0"])
def test_compare_shard_names_the_flag(text):
    with pytest.raises(errors.ConfigError, match="--shard="):
        compare.parse_shard(text)


@pytest.mark.parametrize("argv,needle", [
    (["pathfinder", "--num", "0"], "num=0 (--num): must be an integer >= 10"),
    (["pathfinder", "--resolution", "0"], "resolution=0 (--resolution)"),
    (["listops", "--num_train", "0"], "num_train=0 (--num_train)"),
    (["listops", "--min_length", "9", "--max_length", "10"], "length window"),
    (["listops", "--min_length", "0", "--max_length", "3", "--num_train", "50"],
     "only 10 distinct examples"),
])
def test_generators_refuse_impossible_requests(argv, needle, tmp_path, capsys):
    """In-process: exit status 2, one line, no folder left behind (the ListOps case used to
    loop forever)."""
    t0 = time.time()
    assert data_cli.main(argv + ["--out", str(tmp_path / "out"), "--no_progress"]) == 2
    assert time.time() - t0 < 60
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "out").exists() or not any(
        p.is_file() for p in (tmp_path / "out").rglob("*"))


def _cli(args, env=None, timeout=240):
    full_env = dict(os.environ, JAX_PLATFORMS="cpu", **(env or {}))
    full_env.pop("XLA_FLAGS", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def _one_line(p, prog, needle):
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert p.returncode == 2, p.stderr[-3000:]
    assert lines and lines[-1].startswith(f"{prog}: error: ") and needle in lines[-1], lines[-3:]
    assert "Traceback" not in p.stderr


def test_cli_rows_one_line_exit_2(lra, tmp_path):
    """Real subprocesses: a misspelt key (the key path, nothing written), --seeds=a, and an
    eval_batch_size that does not divide 2 devices (named before any training)."""
    wd = tmp_path / "typo"
    p = _cli(["sptlib.main", "--config=experiments/smoke.py", f"--workdir={wd}",
              "--config.stages.pretrain.num_stepz=3"])
    _one_line(p, "sptlib.main", "--config.stages.pretrain.num_stepz: no such config key")
    assert not wd.exists()

    p = _cli(["sptlib.compare", "--config=experiments/quickstart.py",
              f"--workdir={tmp_path / 'cmp'}", "--seeds=a", "--dry_run"])
    _one_line(p, "sptlib.protocol.compare", "--seeds=a: 'a' is not an integer")

    p = _cli(["sptlib.main", "--config=experiments/smoke.py", f"--workdir={tmp_path / 'odd'}",
              f"--config.data.lra_dir={lra}", "--config.stages.pretrain.eval_batch_size=3"],
             env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    _one_line(p, "sptlib.main", "config.stages.pretrain.eval_batch_size=3: the batch is split "
                                "over 2 devices")
    assert not list((tmp_path / "odd").rglob("checkpoints"))
    # With --verbose the same error carries its traceback.
    p = _cli(["sptlib.main", "--config=experiments/smoke.py", f"--workdir={tmp_path / 'odd'}",
              f"--config.data.lra_dir={lra}", "--config.stages.pretrain.batch_size=3",
              "--verbose"], env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert p.returncode == 2 and "Traceback" in p.stderr and "batch_size=3" in p.stderr


def test_killed_generation_is_rebuilt_not_trusted(tmp_path):
    """SIGKILL a Pathfinder generation half way: no folder a run would trust is left, and the
    next run that needs the data generates it again."""
    out = tmp_path / "lra"
    proc = subprocess.Popen([sys.executable, "-m", "sptlib.data", "pathfinder", "--out", str(out),
                             "--num", "3000", "--resolution", "16", "--no_progress"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not list(out.rglob("sample_5.png")):
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    final = out / "pathfinder16" / "curv_contour_length_14"
    assert not final.exists()  # only the hidden partial folder
    from sptlib import data as data_lib
    cfg = data_lib.data_config()
    cfg.update(task="pathfinder", lra_dir=str(out), resolution=16,
               difficulty="curv_contour_length_14")
    cfg.generate.update(enabled=True, num_train=16, num_val=2, num_test=2)
    task = data_lib.get_task(cfg)
    assert len(task.source("train")) == 16 and len(task.source("test")) == 2
    assert sorted(p.name for p in (out / "pathfinder16").iterdir()
                  if not p.name.endswith(".lock")) == [
        "curv_contour_length_14"]  # the killed run's partial folder was removed
