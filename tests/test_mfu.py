"""Model FLOPs as PaLM counts them (`sptlib.train.flops.model_flops`) and the utilisation
`sptlib.aot` derives from them, against hand counts."""

import pytest

from sptlib import data as data_lib
from sptlib.configs import presets, testing
from sptlib.protocol import aot
from sptlib.slices import topologies
from sptlib.train import flops, setup
from test_splash_costs import dense_keep  # noqa: E402 (tests/ is on sys.path under pytest)


@pytest.mark.parametrize("length,causal,window", [
    (1, False, 0), (7, False, 0), (7, True, 0), (64, False, 5), (64, True, 5), (9, False, 8),
    (9, True, 3), (10, False, 100)])
def test_attended_pairs_count_a_dense_mask(length, causal, window):
    keep = dense_keep(length, causal, window)
    assert flops.attended_pairs(length, causal=causal, window=window) == keep.sum()


@pytest.mark.parametrize("causal,window,pairs", [(False, 0, 64 * 64), (True, 0, 64 * 65 // 2),
                                                  (False, 5, 674)])
def test_model_flops_of_a_tiny_transformer_by_hand(causal, window, pairs):
    config = testing.tiny(presets.build("listops", "transformer", "spt-masked"))
    config.model.n_layers, config.model.causal = 2, causal
    config.model.attention.window = window
    built = setup.build_stage(config, "pretrain", info=data_lib.task_info(config.data),
                              abstract=True)
    m = built.model_cfg
    d, f, vocab, layers = 16, 64, 17, 2  # d_model, FFN width, ids, blocks of this config
    assert (m.d_model, m.d_model * m.ffn_mult, m.vocab_size, m.n_layers) == (d, f, vocab, layers)
    batch, length = 4, 64
    assert (config.stages.pretrain.batch_size, data_lib.sequence_length(config.data)) == (
        batch, length)
    # Per block: q, k, v, out projections with biases; FFN d->f->d with biases; two layer norms.
    block = 4 * (d * d + d) + (d * f + f + f * d + d) + 2 * 2 * d
    non_embedding = layers * block + 2 * d + (d * vocab + vocab)  # + final norm + logits head
    assert built.num_params == non_embedding + vocab * d  # the id embedding is the rest
    want = 6 * non_embedding * batch * length + 12 * batch * pairs * d * layers
    got = flops.stage_model_flops(config, "pretrain", m, built.state.params)
    assert got["pairs"] == pairs and got["tokens"] == batch * length
    assert got["model_flops"] == want


def test_bypassed_mixers_and_retrieval_documents():
    config = testing.tiny(presets.build("retrieval", "transformer", "spt-masked"))
    built = setup.build_stage(config, "pretrain", info=data_lib.task_info(config.data),
                              abstract=True)
    got = flops.stage_model_flops(config, "pretrain", built.model_cfg, built.state.params)
    length = data_lib.sequence_length(config.data)
    assert got["tokens"] == 2 * config.stages.pretrain.batch_size * length  # two documents
    with config.unlocked():
        config.stages.pretrain.bypass_mixers = True  # mlpinit's first stage: no mixer runs
    got = flops.stage_model_flops(config, "pretrain", built.model_cfg, built.state.params)
    assert got["attention_flops"] == 0 and got["model_flops"] == got["dense_flops"] > 0


def test_utilisation_is_model_flops_over_the_best_case_time():
    spec = topologies.slice_spec("v4-8")  # 4 chips at 275 TFLOP/s
    rec = {"model_flops": 1.1e15, "bound_seconds": 2.0, "xla_flops": 1.43e15, "steps": 1000}
    u = aot.utilisation(rec, spec, mfu=0.4)
    assert u["bound_mfu"] == pytest.approx(1.1e15 / (4 * 2.0 * 275e12)) == pytest.approx(0.5)
    assert u["compiler_ratio"] == pytest.approx(1.3)
    # Chip-hours from the same time: 1000 steps x 4 chips x 2 s.
    assert u["chip_hours_bound"] == pytest.approx(1000 * 4 * 2.0 / 3600)
    assert u["mfu"] == 0.4 and u["chip_hours"] == pytest.approx(1000 * 1.1e15 / (275e12 * 0.4)
                                                                  / 3600)
    low = aot.utilisation(dict(rec, bound_seconds=5.0), spec, mfu=0.4)  # bound 20% < 40%
    assert low["mfu"] == pytest.approx(0.2)
    assert low["chip_hours"] == pytest.approx(low["chip_hours_bound"])
    none = aot.utilisation(dict(rec, bound_seconds=None), spec, mfu=0.4)
    assert none["bound_mfu"] is None and none["chip_hours_bound"] is None
