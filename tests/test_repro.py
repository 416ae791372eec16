"""Reproducibility and robustness contracts (issue 62): nothing read or written through a
planted link, the best checkpoint or a clear line, bounded and correct stops, user files that
end in one line, results that verify against their checkpoint, and determinism on CPU.

Rows join the fault table of docs/bad_inputs.md (`test_faults.record`).
"""

import json
import os
import pathlib
import shutil
import sys

import pytest

from sptlib import console, errors
from sptlib.protocol import stages
from sptlib.train import results as results_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]
from test_bad_inputs import _config  # noqa: E402
from test_faults import expect_error, record  # noqa: E402
from test_hostile_workdirs import tree_state  # noqa: E402


@pytest.fixture(scope="module")
def finished(lra, tmp_path_factory):
    """A finished tiny run (scratch, 4 steps, checkpoints at 2 and 4): copied by each test."""
    wd = tmp_path_factory.mktemp("finished") / "run"
    stages.run(_config(lra), str(wd))
    return wd


@pytest.fixture
def decoy(tmp_path):
    """Files outside the workdir that a planted link points at: byte-identical afterwards."""
    d = tmp_path / "decoy"
    d.mkdir()
    (d / "victim_log").write_text("precious log\n")
    # Valid JSON: read through, it would be taken for this run's own file.
    (d / "victim_results.json").write_text(json.dumps(
        {"stage": "scratch", "status": "finished", "final_step": 4, "best_step": 4,
         "best_metric": "accuracy", "validation": {"best": {"accuracy": 0.987}}}))
    (d / "victim_config.json").write_text('{"model": {"d_model": 16}}')
    before = tree_state(d)
    yield d
    assert tree_state(d) == before, "a run read or wrote through a planted link"


def _copy(finished, tmp_path):
    wd = tmp_path / "wd"
    shutil.copytree(finished, wd, symlinks=True)
    return wd


# -- item 3: nothing read or written through a planted link ------------------------------------

def test_planted_log_link_is_replaced_not_written_through(lra, finished, tmp_path, decoy,
                                                         caplog):
    wd = _copy(finished, tmp_path)
    (wd / "log.txt").unlink(missing_ok=True)
    os.symlink(decoy / "victim_log", wd / "log.txt")
    console.setup("test", verbose=False)
    try:
        with caplog.at_level("WARNING"):
            stages.run(_config(lra), str(wd))
    finally:
        console.reset()
    assert (wd / "log.txt").is_file() and not (wd / "log.txt").is_symlink()
    assert "==== " in (wd / "log.txt").read_text()  # this run's log went into its own file
    assert "is a symbolic link (to " in caplog.text and "not written through" in caplog.text
    record("hostile", "a finished workdir's log.txt planted as a symlink to a file outside",
           "HELD: the link is replaced by a regular log file (one warning naming the link); "
           "the file it pointed at is byte-identical")


@pytest.mark.parametrize("name", ["scratch/results.json", "scratch/config.json"])
def test_planted_stage_json_link_is_named_a_link(lra, finished, tmp_path, decoy, name):
    wd = _copy(finished, tmp_path)
    (wd / name).unlink()
    target = decoy / ("victim_results.json" if "results" in name else "victim_config.json")
    os.symlink(target, wd / name)
    e = expect_error("hostile", f"a finished workdir's {name} planted as a symlink to a "
                     "(valid JSON) file outside", lambda: stages.run(_config(lra), str(wd)),
                     errors.ResultsError, "is a symbolic link (to ")
    line = errors.one_line(e)
    assert "truncated" not in line and str(wd / name) in line, line
    assert (wd / name).is_symlink()  # left as found


def test_read_json_refuses_a_link_and_reads_a_file(tmp_path):
    (tmp_path / "real.json").write_text('{"a": 1}')
    os.symlink(tmp_path / "real.json", tmp_path / "link.json")
    assert results_lib.read_json(tmp_path / "real.json") == {"a": 1}
    with pytest.raises(errors.ResultsError, match="is a symbolic link"):
        results_lib.read_json(tmp_path / "link.json")


# -- item 4: the best checkpoint or a clear line -----------------------------------------------

def _two_stage(lra, **finetune):
    c = _config(lra)
    for name in ("pretrain", "finetune"):
        s = c.stages[name]
        s.num_steps, s.eval_every, s.checkpoint_every, s.log_every = 4, 2, 2, 2
        s.batch_size, s.eval_batch_size, s.keep = 8, 16, 2
    # lr=0: every evaluation ties, so the best is the first (step 2), the latest step 4.
    c.stages.pretrain.optim.update(lr=0.0, warmup_steps=0, schedule="constant")
    c.stages.finetune.update(finetune)
    c.stage_order = ("pretrain",)
    return c


@pytest.fixture(scope="module")
def pretrained(lra, tmp_path_factory):
    """A finished pretraining stage (best step 2, latest 4), copied by each test."""
    wd = tmp_path_factory.mktemp("pretrained") / "run"
    res = stages.run(_two_stage(lra), str(wd))["stages"]["pretrain"]
    assert res.best_step == 2 and (wd / "pretrain" / "checkpoints" / "4").is_dir()
    return wd


def test_init_from_a_best_checkpoint_that_is_gone_is_one_line(lra, pretrained, tmp_path):
    wd = _copy(pretrained, tmp_path)
    shutil.rmtree(wd / "pretrain" / "checkpoints" / "2")
    c = _two_stage(lra)
    c.stage_order = ("pretrain", "finetune")
    e = expect_error("checkpoints", "pretraining finished (best step 2), its best checkpoint "
                     "deleted, then the finetune stage (init_from=pretrain)",
                     lambda: stages.run(c, str(wd)), errors.NoCheckpointError,
                     "its best checkpoint, step 2 (pretrain/results.json), is gone")
    line = errors.one_line(e)
    assert "init_fallback=True" in line and "step 4" in line, line
    assert not (wd / "finetune" / "checkpoints").exists()  # nothing trained


@pytest.mark.slow
def test_init_fallback_starts_from_the_best_that_exists_and_records_it(lra, pretrained,
                                                                       tmp_path, caplog):
    wd = _copy(pretrained, tmp_path)
    shutil.rmtree(wd / "pretrain" / "checkpoints" / "2")
    c = _two_stage(lra, init_fallback=True)
    c.stage_order = ("pretrain", "finetune")
    with caplog.at_level("WARNING"):
        res = stages.run(c, str(wd))["stages"]["finetune"]
    assert res.finished
    assert "its best checkpoint, step 2 (pretrain/results.json), is gone" in caplog.text
    assert res.init["kind"] == "init_from" and res.init["checkpoint"].endswith("/4")
    saved = json.loads((wd / "finetune" / "results.json").read_text())
    assert saved["init"]["fallback"] == {"missing_step": 2, "used_step": 4}
    run = json.loads((wd / "results.json").read_text())
    assert run["stages"]["finetune"]["init"]["fallback"] == {"missing_step": 2, "used_step": 4}
    from sptlib.protocol import records
    spec = type("Spec", (), {"model": "m", "regime": "spt", "seed": 0, "data_fraction": 1.0,
                             "config": c, "workdir": str(wd)})()
    rec = records.make_record(spec, results_lib.read_run(wd), status="finished")
    assert rec["stages"]["finetune"]["init_fallback"] == {"missing_step": 2, "used_step": 4}
    record("checkpoints", "the same with stages.finetune.init_fallback=True",
           "HELD: a warning naming step 2; starts from step 4, recorded in results.json "
           "(init.fallback) and comparison.json (stages.finetune.init_fallback)")


@pytest.mark.slow
def test_best_deleted_mid_run_warning_names_the_deleted_step(lra, tmp_path, caplog):
    """lr=0, 6 steps, keep=2: every evaluation ties; the manager keeps steps 4 and 6 and prunes
    step 2 itself. history.json edited so steps 2 and 4 tie as the best, step 4's folder
    deleted: the warning names step 4 (the one deleted), not step 2 (pruned by design)."""
    c = _config(lra, num_steps=6, keep=2)
    c.stages.scratch.optim.update(lr=0.0, warmup_steps=0, schedule="constant")
    wd = tmp_path / "wd"
    stages.run(c, str(wd))
    ckpts = wd / "scratch" / "checkpoints"
    assert not (ckpts / "2").exists() and (ckpts / "4").is_dir()
    (wd / "scratch" / "results.json").unlink()  # as if killed after the last checkpoint
    shutil.rmtree(ckpts / "4")
    history_path = wd / "scratch" / "history.json"
    history = json.loads(history_path.read_text())
    for h in history:
        if h["step"] in (2, 4):
            h["accuracy"] += 0.5
    history_path.write_text(json.dumps(history))
    with caplog.at_level("WARNING"):
        stages.run(c, str(wd))
    assert "the best checkpoint, step 4 (" in caplog.text, caplog.text
    assert "the best checkpoint, step 2 (" not in caplog.text, caplog.text


# -- item 5: bounded, correct stops ------------------------------------------------------------

@pytest.mark.parametrize("field,value", [("lr", float("nan")), ("lr", float("inf")),
                                         ("ssm_lr", float("nan")), ("ssm_dt_lr", float("inf")),
                                         ("weight_decay", float("nan"))])
def test_non_finite_learning_rates_are_refused_at_config_time(lra, tmp_path, field, value):
    c = _config(lra)
    c.stages.scratch.optim[field] = value
    wd = tmp_path / "wd"
    expect_error("config ranges", f"stages.scratch.optim.{field}={value}",
                 lambda: stages.run(c, str(wd)), errors.ConfigError,
                 f"config.stages.scratch.optim.{field}={value!r}: must be a finite number")
    assert not (wd / "scratch").exists()  # nothing trained, nothing written


@pytest.mark.parametrize("name", ["comparison.json", "comparison.shard0of2.json"])
def test_main_on_a_compare_workdir_is_refused(lra, tmp_path, name):
    wd = tmp_path / "grid"
    wd.mkdir()
    (wd / name).write_text("[]")
    expect_error("workdir", f"sptlib.main pointed at a sptlib.compare grid's folder ({name})",
                 lambda: stages.run(_config(lra), str(wd)), errors.ConfigError,
                 f"is a sptlib.compare grid's folder (it holds {name})")
    assert sorted(p.name for p in wd.iterdir()) == [name]  # nothing written beside the grid


EXIT_BOUND_S = errors.EXIT_GRACE_S + 10.0  # the exit guard's grace, and a loaded machine's margin


def _time_to_exit(cmd, timeout=400):
    """Runs `cmd`; returns (exit status, its last stderr line, seconds from that error line
    being printed to the process having exited)."""
    import subprocess
    import threading
    import time
    from test_faults import _cli_env
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_cli_env(), stderr=subprocess.PIPE, text=True)
    seen = []

    def read():
        for ln in proc.stderr:
            seen.append((time.monotonic(), ln.rstrip("\n")))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    ended = time.monotonic()
    reader.join(10)
    errs = [(t, ln) for t, ln in seen if ln.startswith(("sptlib.main: error: ",
                                                         "sptlib.main: stopped: "))]
    assert errs, "\n".join(ln for _, ln in seen)[-3000:]
    return proc.returncode, errs[-1][1], ended - errs[-1][0]


@pytest.mark.slow
def test_exit_is_bounded_after_the_one_line_per_error_class(lra, finished, tmp_path):
    """Per error class, a real `sptlib.main`: the process is gone within EXIT_BOUND_S of its
    one line (orbax's async saves, data workers and the exit guard included)."""
    from test_faults import _smoke_cmd
    from sptlib.data import listops
    bad = tmp_path / "bad_data"
    shutil.copytree(lra, bad)
    (bad / listops.FOLDER / listops.SPLIT_FILES["train"]).write_bytes(
        b"Source\tTarget\n( [MAX \xff 3 ] )\t3\n")
    linked = _copy(finished, tmp_path)
    (linked / "scratch" / "results.json").unlink()
    (tmp_path / "other.json").write_text("{}")
    os.symlink(tmp_path / "other.json", linked / "scratch" / "results.json")
    cases = {
        "ConfigError (lr=nan)": (_smoke_cmd(lra, tmp_path / "a",
                                            "--config.stages.scratch.optim.lr=nan"), 2,
                                 "ConfigError: config.stages.scratch.optim.lr=nan"),
        "DataError (a non-UTF-8 byte in the data)": (_smoke_cmd(bad, tmp_path / "b"), 2,
                                                     "DataError: "),
        "NonFiniteLossError (lr=1e9, async saves)": (_smoke_cmd(
            lra, tmp_path / "c", "--config.stages.scratch.optim.lr=1e9",
            "--config.stages.scratch.optim.warmup_steps=0",
            "--config.stages.scratch.optim.schedule=constant"), 2, "NonFiniteLossError: "),
        "ResultsError (results.json a planted link)": (_smoke_cmd(lra, linked), 2,
                                                         "is a symbolic link (to "),
    }
    measured = {}
    for case, (cmd, code, needle) in cases.items():
        rc, line, after = _time_to_exit(cmd)
        assert rc == code and needle in line, (case, rc, line)
        measured[case] = after
        assert after < EXIT_BOUND_S, (case, after, line)
        record("exits", f"{case}: seconds from the one line to the process gone (CLI)",
               f"HELD: exit {rc} {after:.1f} s after the line (bound {EXIT_BOUND_S:.0f} s)")
    print("seconds from the one line to the exit:", measured)


# -- item 7: the user-file cases ---------------------------------------------------------------

def _bad_file(tmp_path, make, *needles, **files):
    """test_user_files._bad: one line holding every needle, exit 2, nothing written."""
    from test_user_files import _bad
    return _bad(tmp_path, make, needles, **files)


def test_npz_with_fewer_labels_than_rows_is_one_line_before_anything(tmp_path):
    import numpy as np

    def make(t):
        np.savez(t / "d.npz", inputs=np.ones((60, 8), np.int64), label=np.arange(55) % 2)
        return t / "d.npz"
    line = _bad_file(tmp_path, make, "d.npz: column 'label' has 55 rows, column 'inputs' 60")
    record("user files", ".npz whose inputs has 60 rows and label 55",
           f"one line, exit 2, nothing written: {line}")


def test_a_token_id_past_int32_is_one_line_naming_row_and_value(tmp_path):
    from test_user_files import _jsonl
    rows = [{"inputs": [1, 2, 3], "label": i % 2} for i in range(6)]
    rows[3]["inputs"] = [1, 10 ** 12, 3]
    line = _bad_file(tmp_path, lambda t: _jsonl(t / "big.jsonl", rows),
                     "big.jsonl: row 4, column 'inputs': token id 1000000000000 at position 1 "
                     "outside the vocabulary 0..")
    record("user files", "a token id of 10**12 (no vocab_size given)",
           f"one line, exit 2, no data_spec.json: {line}")


@pytest.mark.parametrize("label", [7, "dog"])
def test_a_single_class_is_refused(tmp_path, label):
    from test_user_files import _jsonl
    rows = [{"inputs": [1, 2, 3], "label": label}] * 8
    line = _bad_file(tmp_path, lambda t: _jsonl(t / "one.jsonl", rows),
                     f"one.jsonl: column 'label' holds a single class ({label!r}) in all 8 rows",
                     "label_column=''")
    record("user files", f"a label column of a single class ({label!r})",
           f"REFUSED (no flag: label_column='' for data without labels), exit 2: {line}")


def test_numeric_string_labels_are_the_classes_that_occur(tmp_path):
    """Labels "1", "2", "10" in a CSV: three classes ordered by value (no phantom class 0..9),
    every row's label the index of its class; a declared num_classes keeps them ids."""
    from sptlib.data import get_task, user_files
    from test_user_files import _cfg, _csv
    labels = ["1", "2", "10", "2", " 1", "10"]
    path = _csv(tmp_path / "t.csv", ["inputs", "label"],
                [["3 4 5", y] for y in labels])
    c = _cfg(path, validation=str(path), test=str(path))
    spec = user_files.infer(c)
    assert spec["classes"] == ["1", "2", "10"] and spec["num_classes"] == 3
    src = get_task(c).source("train")
    assert [int(src[i]["label"]) for i in range(len(labels))] == [0, 1, 2, 1, 0, 2]
    c.files.num_classes = 11
    user_files._MEMO.clear()
    spec = user_files.infer(c)
    assert spec["classes"] is None and spec["num_classes"] == 11
    record("user files", 'labels "1", "2", "10" in a CSV',
           "HELD: the classes that occur, ordered by value (3 classes, no phantom class 0); "
           "num_classes=11 declared keeps them class ids")


def test_a_validation_label_unseen_in_train_is_named(tmp_path):
    from test_user_files import _csv
    train = _csv(tmp_path / "train.csv", ["inputs", "label"], [["3 4", "1"], ["5 6", "2"]] * 4)
    val = _csv(tmp_path / "val.csv", ["inputs", "label"], [["3 4", "1"], ["5 6", "3"]])
    line = _bad_file(tmp_path, lambda t: train, "val.csv: row 2, column 'label': label 3 is not "
                     "a class of the train file (2 classes)", validation=str(val))
    assert line


def test_record_spec_does_not_write_through_a_planted_tmp_link(tmp_path):
    """data_spec.json is written through a fresh temporary name and os.replace: the old fixed
    `data_spec.json.tmp` planted as a link to a decoy, and data_spec.json itself a dangling link
    into the decoy folder: the decoy is untouched, the spec a regular file."""
    from sptlib.data import record_spec
    from test_user_files import _cfg, _jsonl
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    (decoy / "victim").write_text("precious\n")
    before = tree_state(decoy)
    path = _jsonl(tmp_path / "t.jsonl", [{"inputs": [1, 2], "label": i % 2} for i in range(8)])
    wd = tmp_path / "wd"
    wd.mkdir()
    os.symlink(decoy / "victim", wd / "data_spec.json.tmp")
    record_spec(_cfg(path), str(wd))
    assert (wd / "data_spec.json").is_file() and not (wd / "data_spec.json").is_symlink()
    assert json.loads((wd / "data_spec.json").read_text())["num_classes"] == 2
    assert tree_state(decoy) == before
    (wd / "data_spec.json").unlink()
    os.symlink(decoy / "new_spec", wd / "data_spec.json")
    with pytest.raises(errors.DataError, match="is a symbolic link"):
        record_spec(_cfg(path), str(wd))
    assert tree_state(decoy) == before


def _sigterm_caught(pid):
    """Whether process `pid` has a handler for SIGTERM (its SigCgt mask, /proc)."""
    import signal
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("SigCgt:"):
                    return bool(int(ln.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except OSError:
        pass
    return False


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_sigterm_before_the_lock_exits_3(lra, tmp_path):
    """SIGTERM as soon as the command can take it (its handler is installed) and before the
    workdir's lock exists: exit 3, one line, nothing of the run written."""
    import signal
    import subprocess
    import time
    from sptlib.train import lock as lock_lib
    from test_faults import _cli_env, _smoke_cmd
    wd = tmp_path / "wd"
    proc = subprocess.Popen(_smoke_cmd(lra, wd), cwd=ROOT, env=_cli_env(),
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 200
        while not _sigterm_caught(proc.pid) and not (wd / lock_lib.LOCK_FILE).exists():
            assert proc.poll() is None and time.time() < deadline, "ended or stalled"
            time.sleep(0.002)
        assert not (wd / lock_lib.LOCK_FILE).exists(), "no SIGTERM handler before the lock"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert proc.returncode == 3, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and lines[-1].startswith(
        "sptlib.main: stopped: PreemptedError: "), lines[-1]
    assert not (wd / "scratch").exists()
    record("signals", "SIGTERM before the workdir's lock is taken (flags, imports, JAX start)",
           f"one line, exit 3: {lines[-1][:150]}")


# -- item 2: results that verify ----------------------------------------------------------------

def _edit(path, value):
    data = json.loads(path.read_text())
    if "stages" in data:  # the runner's summary
        data["stages"]["scratch"]["test_accuracy_best"] = value
    else:
        data["test"]["best"]["accuracy"] = value
    path.write_text(json.dumps(data, indent=2))


def test_results_carry_a_digest_that_readers_check(finished):
    for path in (finished / "results.json", finished / "scratch" / "results.json"):
        data = json.loads(path.read_text())
        assert data[results_lib.DIGEST_KEY] == results_lib.content_digest(data), path
    assert results_lib.read_stage(finished / "scratch").finished
    assert results_lib.read_run(finished).complete


def test_an_edited_stage_result_is_recomputed_not_reported(lra, finished, tmp_path, caplog):
    wd = _copy(finished, tmp_path)
    true = json.loads((wd / "scratch" / "results.json").read_text())["test"]["best"]["accuracy"]
    _edit(wd / "scratch" / "results.json", 0.987)
    with pytest.raises(errors.ResultsDigestError, match="differ from the digest"):
        results_lib.read_stage(wd / "scratch")
    with caplog.at_level("WARNING"):
        res = stages.run(_config(lra), str(wd))
    assert "differ from the digest written with them" in caplog.text
    assert res["stages"]["scratch"].metric("test", "best", "accuracy") == true != 0.987
    on_disk = json.loads((wd / "scratch" / "results.json").read_text())
    assert on_disk["test"]["best"]["accuracy"] == true
    assert (wd / "scratch" / "results.json.edited").exists()
    assert res["summary"].stages["scratch"]["test_accuracy_best"] == true
    record("results", "an accuracy of 0.987 written into a finished stage's results.json, "
           "then the same command", "HELD: a warning (differs from its digest), the file moved "
           "to results.json.edited, the metrics recomputed from the checkpoints "
           f"({true}, as before the edit)")


def test_compare_never_reports_an_edited_number(finished, tmp_path):
    """The stage's results.json edited: the run counts as unfinished (run again, which
    recomputes it), its number never reported; the runner's summary edited alone: the stage's
    own verified file gives the number."""
    from sptlib.protocol import records
    wd = _copy(finished, tmp_path)
    c = _config(None)
    spec = type("Spec", (), {"model": "transformer", "regime": "scratch", "seed": 0,
                             "data_fraction": 1.0, "config": c, "workdir": str(wd)})()
    true = records.make_record(spec, records.load_results(str(wd)),
                               status="finished")["test_accuracy"]
    _edit(wd / "results.json", 0.987)
    assert records.is_finished(str(wd), ("scratch",))
    rec = records.make_record(spec, records.load_results(str(wd)), status="finished")
    assert rec["test_accuracy"] == true != 0.987
    _edit(wd / "scratch" / "results.json", 0.987)
    assert not records.is_finished(str(wd), ("scratch",))
    rec = records.make_record(spec, records.load_results(str(wd)), status="unfinished")
    assert rec["test_accuracy"] is None
    record("results", "0.987 written into a finished run's summary, then into its stage's "
           "results.json, then sptlib.compare reads the run", "HELD: the summary's edit is "
           "ignored (the stage's verified file counts); the stage's edit makes the run "
           "unfinished (run again: recomputed); 0.987 is never reported")


# -- item 1: determinism on CPU as a contract ----------------------------------------------------

def _busy(cpu):
    """A process spinning on CPU `cpu` (the 'busy machine')."""
    import subprocess
    return subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})"
                             "\nwhile True: pass"])


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_a_cpu_run_is_bitwise_the_same_alone_and_beside_busy_processes(lra, tmp_path):
    """The same short config, on one CPU: alone, then sharing that CPU with two processes that
    spin on it: identical params fingerprints and metrics (the thread setting, the CPUs visible,
    is the same; what it depends on is recorded in resolved.json `reproducibility`)."""
    import subprocess
    import time
    from test_faults import _cli_env, _smoke_cmd
    cpu = sorted(os.sched_getaffinity(0))[0]
    out = {}
    for case in ("alone", "loaded"):
        wd = tmp_path / case
        busy = [_busy(cpu), _busy(cpu)] if case == "loaded" else []
        try:
            t0 = time.time()
            p = subprocess.run(_smoke_cmd(lra, wd), cwd=ROOT, env=_cli_env(), text=True,
                               capture_output=True, timeout=900,
                               preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
        finally:
            for b in busy:
                b.kill()
                b.wait()
        assert p.returncode == 0, p.stderr[-3000:]
        res = json.loads((wd / "scratch" / "results.json").read_text())
        resolved = json.loads((wd / "scratch" / "resolved.json").read_text())
        out[case] = (res["params_fingerprint"], res["test"], res["validation"], res["history"],
                     resolved["reproducibility"], time.time() - t0)
    assert out["alone"][4]["cpus_visible"] == 1 and out["alone"][4] == out["loaded"][4]
    assert out["alone"][:4] == out["loaded"][:4], (out["alone"][0], out["loaded"][0])
    record("determinism", "the same short config on one CPU, alone and beside two processes "
           "spinning on that CPU", f"HELD: identical params_fingerprint "
           f"({out['alone'][0][:12]}...) and metrics; {out['alone'][5]:.0f} s alone, "
           f"{out['loaded'][5]:.0f} s loaded")


def test_a_read_only_data_folder_names_the_data_folder(lra, tmp_path, monkeypatch):
    """The data generated into a folder that cannot be written (a read-only $SPTLIB_DATA; the
    tests run as root, so the refusal is injected where the data is written): the line names
    the data folder and how to choose another, not --workdir."""
    import errno as errno_lib
    from sptlib import data as data_lib
    data = tmp_path / "ro_data"

    def read_only(cfg):
        raise PermissionError(errno_lib.EACCES, "Permission denied", str(data / "listops-1000"))
    monkeypatch.setattr(data_lib, "get_task", read_only)
    c = _config(lra)
    c.data.lra_dir = str(data)
    e = expect_error("data", "a data folder that cannot be written (read-only $SPTLIB_DATA)",
                     lambda: stages.run(c, str(tmp_path / "wd")), errors.WriteError,
                     "pick a writable data folder (--config.data.lra_dir=DIR or $SPTLIB_DATA)")
    assert "--workdir" not in errors.one_line(e) and str(data) in errors.one_line(e)
