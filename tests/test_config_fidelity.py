"""The paper presets against the authors' released configs, value for value, plus the hardware
side every preset must name.

The release (IdoAmos/not-from-scratch at f919137) is transcribed into `tests/release/released.json`
by `tests/release/transcribe.py`: every experiment file with an sptlib counterpart, composed with
the defaults it includes, each value with the file that sets it. `tests/paper_configs.py` reads
every preset in the release's terms. Every difference must be a row of the deviation table in
docs/reproducing.md ("Deviations from the released configs": field, release, sptlib, reason,
evidence); a row that matches no difference fails too, so the table cannot go stale.
"""

import fnmatch
import json
import math
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import paper_configs as paper  # noqa: E402

from sptlib.slices import meshes  # noqa: E402
from sptlib.configs import presets  # noqa: E402
from sptlib.configs.paper import TASKS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "reproducing.md")
SECTION = "## Deviations from the released configs"
MIN_COMPARED = 1500
# whole steps: epochs x examples / batch rounded
TOLERANT = ("trainer.max_epochs", "trainer.val_check_interval")


def _name(record):
    return record["experiment"].removeprefix("configs/experiment/").removesuffix(".yaml")


def deviation_rows():
    """The deviation table: dicts of experiments (globs), field (glob), release, sptlib, reason,
    evidence."""
    with open(DOC) as f:
        text = f.read()
    assert SECTION in text, f"docs/reproducing.md has no {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip().replace("\\|", "|")
                 for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) != 6 or cells[0] in ("experiments",) or set(cells[0]) <= {"-", " "}:
            continue
        unq = [c.strip("`") for c in cells]
        rows.append(dict(experiments=[e.strip().strip("`") for e in cells[0].split(",")],
                         field=unq[1], release=unq[2], sptlib=unq[3], reason=cells[4],
                         evidence=cells[5]))
    return rows


def _same(key, want, got):
    if isinstance(want, bool) or isinstance(got, bool) or want is None or got is None:
        return want == got
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(want, got, rel_tol=1e-3 if key in TOLERANT else 1e-9)
    return want == got


def _dump(v):
    return json.dumps(v)


def comparisons():
    """(record, key, release value, sptlib value) for every compared key; and the count of keys
    left out as NOT_COMPARED."""
    out, skipped = [], 0
    configs = {}
    for record in paper.RECORDS:
        k = (record["task"], record["model"])
        if k not in configs:
            configs[k] = presets.build(record["task"], record["model"], "spt-masked")
        config = configs[k]
        for key in record["fields"]:
            if paper.not_compared(key):
                skipped += 1
                continue
            try:
                got = paper.sptlib_value(config, record, key)
            except KeyError as e:
                raise AssertionError(f"{_name(record)}: no sptlib view of {key!r} (add it to "
                                     "tests/paper_configs.py or NOT_COMPARED)") from e
            out.append((record, key, paper.release_value(record, key), got))
    return out, skipped


@pytest.fixture(scope="module")
def compared():
    return comparisons()


def _matches(row, record, key):
    return (any(fnmatch.fnmatchcase(_name(record), e) for e in row["experiments"])
            and fnmatch.fnmatchcase(key, row["field"]))


def test_presets_equal_the_release_or_a_documented_deviation(compared):
    values, skipped = compared
    rows = deviation_rows()
    used = [0] * len(rows)
    undocumented = []
    for record, key, want, got in values:
        if _same(key, want, got):
            continue
        hits = [i for i, r in enumerate(rows) if _matches(r, record, key)]
        ok = False
        for i in hits:
            r = rows[i]
            if r["release"] not in ("*", _dump(want)) or r["sptlib"] not in ("*", _dump(got)):
                continue
            used[i] += 1
            ok = True
            break
        if not ok:
            undocumented.append(f"{_name(record)} {key}: release {_dump(want)} "
                                f"({record['fields'][key]['source']}), sptlib {_dump(got)}")
    assert not undocumented, ("differences not in the deviation table of docs/reproducing.md:\n"
                              + "\n".join(undocumented))
    stale = [f"{r['experiments']} {r['field']}" for r, n in zip(rows, used) if not n]
    assert not stale, f"deviation rows that match no difference: {stale}"
    assert len(values) >= MIN_COMPARED, (len(values), skipped)


def test_every_deviation_has_a_reason_and_evidence():
    rows = deviation_rows()
    assert rows
    for r in rows:
        assert len(r["reason"]) > 15 and len(r["evidence"]) > 5, r


def test_the_transcription_covers_every_released_experiment_with_a_counterpart():
    """Every task x {Transformer, S4} x {pretrain, finetune} has a record (but S4 PathX-256,
    which the release does not have); the experiments without a counterpart are named."""
    have = {(r["task"], r["model"], r["stage"]) for r in paper.RECORDS}
    want = {(t, m, s) for t in TASKS for m in ("transformer", "s4")
            for s in ("pretrain", "finetune")} - {("pathx256", "s4", "pretrain"),
                                                 ("pathx256", "s4", "finetune")}
    assert want <= have
    assert paper.RELEASE["commit"].startswith("f919137")
    with open(DOC) as f:
        doc = f.read()
    for name in paper.RELEASE["unmatched"]:
        assert name.split("/")[-1] in doc, name
    for r in paper.RECORDS:
        assert all(v["source"] for v in r["fields"].values()), _name(r)


def test_pathx256_s4_is_the_pathx_recipe():
    """No released S4 PathX-256 files: the preset is the S4 PathX recipe at 256 x 256."""
    a, b = (presets.build(t, "s4", "spt-masked") for t in ("pathx", "pathx256"))
    assert a.model.to_dict() == b.model.to_dict()
    for s in ("pretrain", "finetune"):
        assert a.stages[s].optim.to_dict() == b.stages[s].optim.to_dict()
        assert a.stages[s].batch_size == b.stages[s].batch_size


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("model", ["transformer", "s4", "dlr"])
def test_scratch_stage_is_the_finetune_stage(task, model):
    """The scratch baseline trains with the finetuning budget and optimiser."""
    c = presets.build(task, model, "scratch")
    ft, sc = c.stages.finetune, c.stages.scratch
    assert (sc.batch_size, sc.num_steps) == (ft.batch_size, ft.num_steps)
    assert sc.optim.to_dict() == ft.optim.to_dict()


def test_causal_spt_finetunes_bidirectionally():
    """The release's causal pretraining is a data setting (`causal_lm`) of a causal backbone;
    its finetuning files are the bidirectional ones. The preset's stages say so."""
    c = presets.build("pathx", "transformer-causal", "spt-causal")
    assert c.stages.pretrain.objective.kind == "causal"
    assert c.stages.pretrain.causal is True and c.stages.finetune.causal is False


def test_a_causal_checkpoint_loads_into_the_bidirectional_model():
    """Causality is a mask, not a parameter: the causal model's parameters are exactly the
    bidirectional model's (same tree, same shapes), and applied there they see both sides."""
    import jax
    import jax.numpy as jnp
    import ml_collections

    from sptlib import models
    cfg = ml_collections.ConfigDict(dict(presets.build("image", "transformer-causal",
                                                       "spt-causal").model.to_dict()))
    cfg.update(n_layers=1, d_model=16, max_length=8, d_input=1)
    cfg.attention.n_heads = 2
    head = dict(kind="classify", num_classes=3)
    causal = models.build_model(cfg, head)
    cfg.causal = False
    bidir = models.build_model(cfg, head)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 2))
    params = causal.init(jax.random.PRNGKey(1), x)
    shapes = lambda t: jax.tree.map(lambda a: a.shape, t)  # noqa: E731
    assert shapes(params) == shapes(bidir.init(jax.random.PRNGKey(1), x))
    feats = lambda m, inp: m.apply(params, inp, method=m.features)  # noqa: E731
    later = x.at[:, -1].set(5.0)  # change the last position only
    assert jnp.allclose(feats(causal, x)[:, 0], feats(causal, later)[:, 0], atol=1e-5)
    assert not jnp.allclose(feats(bidir, x)[:, 0], feats(bidir, later)[:, 0], atol=1e-3)


def test_doc_table_is_one_table_with_the_named_columns():
    with open(DOC) as f:
        section = f.read().split(SECTION, 1)[1].split("\n## ", 1)[0]
    assert re.search(r"\| experiments \| field \| release \| sptlib \| reason \| evidence \|",
                     section)


# ------------------------------------------------------------------------------------------------
# Hardware side: attention kernels, remat, slices and meshes.
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("model", presets.MODELS)
def test_windowed_attention_uses_the_local_kernel(task, model):
    """A window over `impl='plain'` only masks a full L x L score matrix."""
    m = presets.build(task, model, "scratch").model
    if m.attention.window:
        assert m.attention.impl == "local", (task, model)


def test_long_sequence_transformers_are_local_and_their_s4_rematerialised():
    # The long-sequence Transformers run without remat (sptlib/configs/paper.py: 2.5-3.8 GiB
    # per chip with the TPU band backward); S4 keeps it.
    for task, window, remat in (("pathx", 4096, False), ("pathx256", 8192, False),
                                ("speech_commands", 4000, False)):
        for model in ("transformer", "transformer-causal"):
            m = presets.build(task, model, "spt-masked").model
            assert (m.attention.impl, m.attention.window, m.remat, m.scan_layers) == (
                "local", window, remat, True), (task, model)
        assert presets.build(task, "s4", "spt-masked").model.remat


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("model", ["transformer", "s4", "gss-hybrid", "dlr"])
def test_every_preset_names_a_slice_and_a_mesh_that_fits_its_batches(task, model):
    c = presets.build(task, model, "spt-masked")
    devices = meshes.expected_device_count(c.aot.slice)
    sizes = meshes.resolve_axis_sizes(meshes.slice_mesh(c), devices)  # raises if it does not fit
    batch_shards = sizes["data"] * sizes["fsdp"] * sizes["dcn_data"] * sizes["dcn_fsdp"]
    for stage in ("pretrain", "finetune", "scratch"):
        b = c.stages[stage].batch_size
        assert b % batch_shards == 0, (task, model, stage, b, dict(sizes))
    # Tensor parallelism only where a batch cannot be split over every chip.
    if all(c.stages[s].batch_size % devices == 0 for s in ("pretrain", "finetune")):
        assert sizes["tensor"] == 1, (task, model, dict(sizes))
    # Locally the preset is all-data, so it runs on one device as it is.
    assert (c.mesh.data, c.mesh.fsdp, c.mesh.tensor) == (-1, 1, 1), (task, model)


# ------------------------------------------------------------------------------------------------
# Evidence for the deviation table (docs/reproducing.md).
# ------------------------------------------------------------------------------------------------

def _blocked_keys(length, window, look_backward=1, look_forward=1):
    """Keys per query of the release's `mhfla` (local_attention: blocks of `window` positions,
    each attending to its own block and `look_*` blocks on either side)."""
    import numpy as np
    block = np.arange(length) // window
    d = block[None, :] - block[:, None]
    return ((d >= -look_backward) & (d <= look_forward)).sum(axis=1)


def test_local_attention_reach_blocked_vs_band():
    """Interior queries: the release's blocks see 3 * window keys, sptlib's band 2 * window + 1;
    every query of the band also lies in the blocked window's reach of one block either side
    of its own (reach between window and 2 * window - 1)."""
    import numpy as np
    w, n = 8, 64
    keys = _blocked_keys(n, w)
    assert keys[w:-w].min() == keys[w:-w].max() == 3 * w
    band = (np.abs(np.arange(n)[None] - np.arange(n)[:, None]) <= w).sum(axis=1)
    assert band[w:-w].min() == band[w:-w].max() == 2 * w + 1


def test_sinusoidal_positions_are_the_release_table_permuted():
    """sptlib's [sin | cos] halves are the release's interleaved table (`PositionalEncoder`:
    pe[:, 0::2] = sin, pe[:, 1::2] = cos) with its features permuted."""
    import numpy as np

    from sptlib.models.encoders import sinusoidal_positions
    length, d = 50, 16
    position = np.arange(length)[:, None]
    div = np.exp(-np.log(10000.0) * np.arange(0, d, 2) / d)
    pe = np.zeros((length, d))
    pe[:, 0::2], pe[:, 1::2] = np.sin(position * div), np.cos(position * div)
    ours = np.asarray(sinusoidal_positions(length, d))
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
    np.testing.assert_allclose(ours, pe[:, perm], atol=1e-5)
