"""Backbones, encoders, heads and build_model, checked against hand-computed truths."""

import importlib
import pathlib

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sptlib.models import build_model, layer_specs
from sptlib.models.config import model_config
from sptlib.models.heads import pool


def _has(module, name):
    """True, or an error: a broken or missing layer must fail the suite, never become a skip."""
    assert hasattr(importlib.import_module(module), name), f"{module}.{name} is missing"
    return True


def _cfg(**kw):
    c = model_config()
    # Python-loop stacks by default: eager nn.scan compiles per call, which dominates tiny tests.
    c.update(dict(mixer="attention", d_model=16, n_layers=2, vocab_size=12, ffn_mult=2,
                  scan_layers=False))
    c.attention.n_heads = 2
    for key, value in kw.items():
        target = c
        *path, last = key.split(".")
        for p in path:
            target = target[p]
        target[last] = value
    return c


def _tokens(batch, length, vocab=12, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(2, vocab, (batch, length)), jnp.int32)


def _n_params(tree):
    return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(flax.core.meta.unbox(tree)))


# -- patterns -----------------------------------------------------------------------------------

def test_layer_specs_patterns():
    hybrid = layer_specs(_cfg(pattern="gss_hybrid", n_layers=10))
    assert [i for i, (m, _) in enumerate(hybrid) if m == "attention"] == [1, 5, 9]
    assert all(m == "gss" for i, (m, _) in enumerate(hybrid) if i not in (1, 5, 9))
    (wide,) = layer_specs(_cfg(pattern="wide_attention", n_layers=3, d_model=32))
    opts = dict(wide[1])
    assert wide[0] == "attention" and opts["n_heads"] == 6 and opts["head_dim"] == 16
    assert len(layer_specs(_cfg(n_layers=4))) == 4


# S4D runs in the default suite; the other SSM stacks cost 5-15 s of compilation each on CPU, so
# they run with -m slow (their layers are tested on their own in the SSM tests).
SSM_PATTERNS = [
    pytest.param(dict(mixer=name, ffn_mult=0), id=name,
                 marks=[pytest.mark.skipif(not _has("sptlib.layers.ssm", cls),
                                           reason=f"sptlib.layers.ssm.{cls} not landed")]
                 + ([] if name == "s4d" else [pytest.mark.slow]))
    for name, cls in [("s4", "S4Mixer"), ("s4d", "S4DMixer"), ("dss", "DSSMixer"),
                      ("dlr", "DLRMixer"), ("s5", "S5Mixer")]
]
GSS = pytest.mark.skipif(not _has("sptlib.layers.gss", "GSSBlock"),
                         reason="sptlib.layers.gss.GSSBlock not landed")
SMALL_GSS = {"gss.d_state": 16, "gss.expansion": 2}


@pytest.mark.parametrize("overrides", [
    pytest.param({"scan_layers": True, "prenorm": False, "attention.impl": "local", "attention.window": 64,
                  "attention.chunk_size": 64, "positions": "sinusoidal"},
                 id="attention-scan-local-postnorm"),
    pytest.param({"scan_layers": False, "remat": True, "causal": True, "norm": "batch",
                  "attention.impl": "chunked", "attention.chunk_size": 256,
                  "attention.positions": "rotary"}, id="attention-loop-remat-chunked-causal-bn"),
    pytest.param(dict(pattern="wide_attention"), id="wide_attention"),
    *SSM_PATTERNS,
    pytest.param(dict(mixer="gss", **SMALL_GSS), id="gss", marks=[GSS, pytest.mark.slow]),
    pytest.param(dict(pattern="gss_hybrid", **SMALL_GSS), id="gss_hybrid", marks=GSS),
])
def test_every_pattern_forward_backward_at_1024(overrides):
    c = _cfg(**overrides)
    model = build_model(c, {"kind": "classify", "num_classes": 3})
    x = _tokens(1, 1024)
    mask = jnp.arange(1024)[None] < 1000

    @jax.jit  # init and gradient in one compilation: compiling dominates this test on CPU
    def init_and_grad(key):
        variables = model.init(key, x, mask)
        rest = {k: v for k, v in variables.items() if k != "params"}

        def loss(p):
            logits, _ = model.apply({"params": p, **rest}, x, mask, deterministic=False,
                                    rngs={"dropout": jax.random.PRNGKey(1)},
                                    mutable=list(rest))
            return jnp.sum(jax.nn.log_softmax(logits)[:, 0])
        return variables["params"], jax.value_and_grad(loss)(variables["params"])

    params, (value, grads) = init_and_grad(jax.random.PRNGKey(0))
    assert set(params) == {"encoder", "backbone", "head"}
    # Every parameter carries one logical axis name per dimension.
    boxes = jax.tree.leaves(params, is_leaf=lambda a: isinstance(a, nn.Partitioned))
    assert all(isinstance(b, nn.Partitioned) and len(b.names) == b.value.ndim for b in boxes)
    assert np.isfinite(float(value))
    leaves = jax.tree.leaves(flax.core.meta.unbox(grads))
    assert all(np.all(np.isfinite(g)) for g in leaves)
    assert sum(float(jnp.abs(g).sum()) for g in leaves) > 0


def test_scan_equals_python_loop():
    """The nn.scan stack computes the same function as named layers with the same weights."""
    x = _tokens(2, 32)
    mask = jnp.arange(32)[None] < jnp.array([[32], [20]])
    loop = build_model(_cfg(n_layers=3, scan_layers=False), {"kind": "token_logits"})
    scan = build_model(_cfg(n_layers=3, scan_layers=True), {"kind": "token_logits"})
    p = flax.core.meta.unbox(loop.init(jax.random.PRNGKey(0), x, mask))["params"]
    layers = [p["backbone"][f"layer_{i}"] for i in range(3)]
    stacked = {"layer": jax.tree.map(lambda *a: jnp.stack(a), *layers)}
    p_scan = dict(p, backbone={"layers": stacked, "final_norm": p["backbone"]["final_norm"]})
    # The scanned init has exactly this structure and leading `layers` axis.
    init_scan = scan.init(jax.random.PRNGKey(0), x, mask)["params"]
    assert (jax.tree.structure(flax.core.meta.unbox(init_scan)) == jax.tree.structure(p_scan))
    box = init_scan["backbone"]["layers"]["layer"]["block"]["mixer"]["query"]
    assert box.names == ("layers", "embed", "heads", "kv")
    np.testing.assert_allclose(scan.apply({"params": p_scan}, x, mask),
                               loop.apply({"params": p}, x, mask), atol=1e-5)


@pytest.mark.parametrize("unroll", [2, pytest.param(3, marks=pytest.mark.slow)])  # 3: odd, 20 s
def test_scan_unroll_keeps_parameters_and_random_streams(unroll):
    """`scan_unroll` only changes the loop: the same init (bitwise), the same training-mode
    outputs (dropout on, same key) and the same gradients as the rolled scan."""
    x = _tokens(2, 32)
    mask = jnp.arange(32)[None] < jnp.array([[32], [20]])
    kw = dict(n_layers=3, scan_layers=True, dropout=0.3)
    rolled = build_model(_cfg(**kw), {"kind": "token_logits"})
    unrolled = build_model(_cfg(scan_unroll=unroll, **kw), {"kind": "token_logits"})
    p = flax.core.meta.unbox(rolled.init(jax.random.PRNGKey(0), x, mask))["params"]
    p_u = flax.core.meta.unbox(unrolled.init(jax.random.PRNGKey(0), x, mask))["params"]
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(p_u), strict=True):
        np.testing.assert_array_equal(a, b)

    def loss(model, params):
        y = model.apply({"params": params}, x, mask, deterministic=False,
                        rngs={"dropout": jax.random.PRNGKey(3)})
        return jnp.mean(jnp.square(y))
    l_r, g_r = jax.value_and_grad(lambda q: loss(rolled, q))(p)
    l_u, g_u = jax.value_and_grad(lambda q: loss(unrolled, q))(p)
    np.testing.assert_allclose(l_u, l_r, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g_r), jax.tree.leaves(g_u), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
    # ... and the loop really is unrolled (3 layers: unroll 3 is the whole stack)
    scans = [e for e in jax.make_jaxpr(lambda q: loss(unrolled, q))(p).jaxpr.eqns
             if e.primitive.name == "scan"]
    assert [e.params["unroll"] for e in scans] == [unroll]


# -- padding ------------------------------------------------------------------------------------

def _padding_case(c, heads, train=False):
    """Outputs of each head for sequences of 30 real tokens padded to 30, 40 (content A) and 52
    (content B); all heads share one set of encoder/backbone parameters."""
    models = [build_model(c, head) for head in heads]
    real = _tokens(2, 30)
    variables = models[0].init(jax.random.PRNGKey(0), real, jnp.ones((2, 30), bool))
    outs = []
    for pad, seed in [(0, 0), (10, 1), (22, 2)]:
        x = jnp.concatenate([real, _tokens(2, pad, seed=seed)], axis=1)
        mask = jnp.broadcast_to(jnp.arange(30 + pad)[None] < 30, x.shape)
        row = []
        for model in models:
            if train:  # batch norm in training mode: statistics from real positions only
                y, _ = model.apply(variables, x, mask, deterministic=False,
                                   mutable=["batch_stats"])
            else:
                y = model.apply(variables, x, mask)
            row.append(np.asarray(y[:, :30]) if y.ndim > 2 else np.asarray(y))
        outs.append(row)
    return outs


def test_pooled_outputs_ignore_padding():
    c = _cfg(**{"attention.positions": "rotary"})
    heads = [{"kind": "classify", "num_classes": 4, "pooling": p} for p in ("mean", "max", "last")]
    base, *others = _padding_case(c, heads)
    for row in others:
        for o, b in zip(row, base):
            np.testing.assert_allclose(o, b, atol=1e-5)
    assert not np.allclose(base[0], base[1])  # the three poolings differ


@pytest.mark.parametrize("overrides,train", [
    (dict(), False),
    ({"norm": "batch", "causal": True, "positions": "learned", "max_length": 64}, True),
    pytest.param(dict(mixer="s4d", ffn_mult=0), False, id="s4d",
                 marks=pytest.mark.skipif(not _has("sptlib.layers.ssm", "S4DMixer"),
                                          reason="S4D not landed")),
])
def test_token_outputs_ignore_padding(overrides, train):
    (base,), *others = _padding_case(_cfg(**overrides), [{"kind": "token_logits"}], train)
    for (o,) in others:
        np.testing.assert_allclose(o, base, atol=1e-5)


def test_pool_against_naive():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 7, 4)).astype(np.float32)
    mask = np.array([[1] * 7, [1] * 3 + [0] * 4, [0, 1, 1, 0, 1, 0, 0]], bool)
    for b in range(3):
        rows = x[b][mask[b]]
        np.testing.assert_allclose(pool(x, mask, "mean")[b], rows.mean(0), rtol=1e-6)
        np.testing.assert_allclose(pool(x, mask, "max")[b], rows.max(0))
        np.testing.assert_allclose(pool(x, mask, "last")[b], x[b, np.nonzero(mask[b])[0][-1]])


# -- encoders and heads -------------------------------------------------------------------------

def test_heads_shapes_and_linear_encoder_mask_channel():
    c = _cfg(encoder="linear", d_input=3, mask_channel=True)
    x = jnp.ones((2, 10, 4))  # d_input + 1 mask-indicator channel
    params = {}
    for head, shape in [({"kind": "pixel_logits"}, (2, 10, 3, 256)),
                        ({"kind": "regress"}, (2, 10, 3)),
                        ({"kind": "classify", "num_classes": 5}, (2, 5))]:
        model = build_model(c, head)
        variables = model.init(jax.random.PRNGKey(0), x, None)
        assert model.apply(variables, x, None).shape == shape
        params[head["kind"]] = variables["params"]
    with pytest.raises(ValueError, match="d_input"):
        model.init(jax.random.PRNGKey(0), jnp.ones((2, 10, 3)), None)
    # Encoder and backbone do not depend on the head: an SPT checkpoint transfers to finetuning.
    for part in ("encoder", "backbone"):
        spt, ft = params["pixel_logits"][part], params["classify"][part]
        assert jax.tree.structure(spt) == jax.tree.structure(ft)
        assert all(a.shape == b.shape for a, b in zip(jax.tree.leaves(spt), jax.tree.leaves(ft)))


def test_token_encoder_keeps_reserved_ids():
    from sptlib.vocab import MASK_ID, PAD_ID
    model = build_model(_cfg(vocab_size=12), {"kind": "token_logits"})
    x = jnp.array([[PAD_ID, MASK_ID, 5, 11]])
    variables = model.init(jax.random.PRNGKey(0), x, None)
    table = flax.core.meta.unbox(variables)["params"]["encoder"]["embed"]["embedding"]
    assert table.shape == (12, 16)
    assert model.apply(variables, x, None).shape == (1, 4, 12)


def test_retrieval_head_is_a_shared_dual_encoder():
    c = _cfg()
    model = build_model(c, {"kind": "retrieval", "num_classes": 2})
    x1, x2 = _tokens(2, 24, seed=1), _tokens(2, 24, seed=2)
    m1 = jnp.arange(24)[None] < jnp.array([[24], [11]])
    m2 = jnp.arange(24)[None] < jnp.array([[7], [24]])
    variables = model.init(jax.random.PRNGKey(0), x1, m1, inputs2=x2, mask2=m2)
    out = model.apply(variables, x1, m1, inputs2=x2, mask2=m2)
    assert out.shape == (2, 2)
    # Independent path: each document through the shared encoder+backbone separately, then the
    # head's MLP on [u, v, u*v, u-v] computed by hand.
    feats = lambda x, m: model.apply(variables, x, m, method="features")
    p = flax.core.meta.unbox(variables)["params"]["head"]
    u, v = pool(feats(x1, m1), m1), pool(feats(x2, m2), m2)
    h = jnp.concatenate([u, v, u * v, u - v], -1)
    h = jax.nn.gelu(h @ p["hidden"]["kernel"] + p["hidden"]["bias"])
    np.testing.assert_allclose(out, h @ p["logits"]["kernel"] + p["logits"]["bias"], atol=1e-5)


# -- paper sizes --------------------------------------------------------------------------------

# Paper-size models are the experiment presets' (sptlib/configs/paper.py; checked against the
# authors' released configs in tests/test_config_fidelity.py), so this table holds only what the
# data decides: (task, name, vocab incl. the 2 reserved ids (0 = continuous), classes, head kind).
PAPER_TASKS = [
    ("listops", "ListOps", 17, 10, "classify"),
    ("text", "Text", 258, 2, "classify"),
    ("retrieval", "Retrieval", 258, 2, "retrieval"),
    ("image", "Image", 0, 10, "classify"),
    ("pathfinder", "Pathfinder", 0, 2, "classify"),
    ("pathx", "PathX", 0, 2, "classify"),
    ("pathx256", "PathX-256", 0, 2, "classify"),
    ("scifar", "sCIFAR", 0, 10, "classify"),
    ("speech_commands", "Speech Commands", 0, 35, "classify"),
]


def paper_config(task, model):
    """config.model of one paper-size preset ('transformer' or an SSM name) and its head."""
    from sptlib.configs import presets
    _, _, vocab, classes, kind = next(t for t in PAPER_TASKS if t[0] == task)
    c = presets.build(task, model, "scratch").model
    c.vocab_size = vocab
    return c, {"kind": kind, "num_classes": classes}


def _count(c, head):
    model = build_model(c, head)
    x = (jnp.zeros((1, 8), jnp.int32) if c.encoder == "token"
         else jnp.zeros((1, 8, c.d_input + int(c.mask_channel))))
    extra = dict(inputs2=x, mask2=None) if head["kind"] == "retrieval" else {}
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), x, None, **extra))
    return _n_params(shapes["params"])


def test_transformer_param_count_matches_formula():
    c, head = paper_config("text", "transformer")
    d, m, v, n = 512, 4, 258, 6
    per_layer = (4 * d * d + 4 * d) + 4 * d + (2 * m * d * d + m * d + d)
    # The head: the release's `sequence_nonelinear` decoder, Linear(d, d) -> ReLU -> Linear.
    assert _count(c, head) == v * d + n * per_layer + 2 * d + (d * d + d) + (d * 2 + 2)


def test_print_paper_size_param_counts(capsys):
    models = ["transformer"] + [m for m, cls in [("s4", "S4Mixer"), ("s4d", "S4DMixer")]
                                if _has("sptlib.layers.ssm", cls)]
    rows = []
    for task, name, *_ in PAPER_TASKS:
        counts = [_count(*paper_config(task, m)) for m in models]
        rows.append(f"| {name} | " + " | ".join(f"{n:,}" for n in counts) + " |")
    table = "\n".join([f"| task | {' | '.join(models)} |", "|---" * (len(models) + 1) + "|",
                       *rows])
    with capsys.disabled():
        print("\n" + table)
    assert len(rows) == len(PAPER_TASKS)
    # docs/models.md states exactly the counts of the built presets.
    docs = (pathlib.Path(__file__).parents[1] / "docs" / "models.md").read_text()
    missing = [r for r in rows if r not in docs]
    assert not missing, f"docs/models.md parameter table is stale: {missing}"
    # The long-sequence Transformers run the local kernel, which adds no parameters.
    for task in ("pathx", "pathx256", "speech_commands"):
        c, head = paper_config(task, "transformer")
        assert c.attention.impl == "local" and c.attention.window > 0, task
        plain = c.copy_and_resolve_references()
        plain.attention.impl = "plain"
        assert _count(plain, head) == _count(c, head)


def test_scan_unroll_rejects_a_non_positive_count():
    with pytest.raises(ValueError, match="model.scan_unroll must be an integer >= 1, got 0"):
        build_model(_cfg(scan_layers=True, scan_unroll=0), {"kind": "token_logits"}).init(
            jax.random.PRNGKey(0), _tokens(1, 8), None)
