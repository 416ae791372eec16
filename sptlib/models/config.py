"""The model section of every experiment config (`config.model`), with a comment per field.

`sptlib.models.build_model(config.model, head)` turns it into a Linen module. Mixer-specific
options live in a sub-dict named after the mixer (e.g. `config.model.s4d.init_kind`) and are passed as
keyword arguments to that mixer's constructor.
"""

import ml_collections


def model_config():
    """Returns the default (small) model config; experiments override sizes."""
    c = ml_collections.ConfigDict()
    # Sequence mixer of every block: attention | s4 | s4d | dss | dlr | s5 | gss | mamba | mamba2
    # (the selective SSMs, sptlib.layers.mamba) | gla | retnet | deltanet | gated_deltanet | mlstm
    # | rwkv7 (linear attention, delta rules, mLSTM, RWKV-7: sptlib.layers.linear_rnn) | hyena
    # (sptlib.layers.hyena).
    c.mixer = "s4d"
    # Block pattern: uniform (n_layers blocks of `mixer`) | gss_hybrid (attention block at every
    # 4th layer starting at the 2nd, GSS elsewhere) | wide_attention (1 layer with n_layers*n_heads heads)
    # | bow (the bag-of-words control: encoder -> mean pooling -> MLP head, no mixer; sptlib.models.bow).
    c.pattern = "uniform"
    # A free hybrid stack (replaces `pattern`, which then stays uniform): a pattern over mixer
    # names repeated to n_layers, its length dividing n_layers, e.g. "gated_deltanet*3,attention"
    # or "s4d,attention(n_heads=8)" (per-layer options in parentheses, on top of
    # config.model.<mixer>); a list of n_layers names / {"mixer": name, **options} is taken too
    # where the config is built with one. "" = every layer is `mixer` (by `pattern`).
    c.layers = ""
    # Model width (features) and depth.
    c.d_model = 64
    c.n_layers = 2
    # Causal (left-to-right) mixers; required for causal SPT. False = bidirectional.
    c.causal = False
    # Dropout inside blocks.
    c.dropout = 0.0
    # Normalisation: layer | batch | rms (RMSNorm, a learned scale and no bias: the modern
    # recipe); pre-norm (True) or post-norm (False) residual blocks.
    c.norm = "layer"
    c.prenorm = True
    # Feed-forward width multiplier (0 disables the FFN sub-block, as in S4 blocks).
    c.ffn_mult = 2
    # Feed-forward kind: gelu (Dense -> GELU -> Dense) | swiglu (SiLU(x W_gate) * (x W_up) ->
    # W_down, Shazeer 2020; hidden width ffn_mult * d_model, so 1.5x gelu's parameters).
    c.ffn = "gelu"
    # Input encoder: token (embedding of ids; vocab includes <pad>=0 and <mask>=1) | linear
    # (continuous inputs [batch, length, d_input], plus one mask-indicator channel if mask_channel).
    c.encoder = "token"
    c.vocab_size = 0  # set from the data (task_info) when 0
    c.d_input = 1
    c.mask_channel = False
    # Positions added by the encoder for attention models: none | sinusoidal | learned
    # (rotary is an attention option, config.model.attention.positions).
    c.positions = "none"
    c.max_length = 0  # for learned positions; set from the data when 0
    # Pooling of the classifier head: mean | max | last (padding always ignored).
    c.pooling = "mean"
    # Stack identical layers with nn.scan (parameters get a leading `layers` axis) / remat each layer.
    c.scan_layers = True
    # Layers per iteration of that loop (lax.scan `unroll`): n_layers unrolls it fully, with
    # the same parameters; faster on CPU for shallow stacks (sptlib.models.backbone).
    c.scan_unroll = 1
    c.remat = False
    # What a rematerialised layer keeps: full (its input only) | dots (also its dense layers'
    # outputs; the backward recomputes only cheap ops): sptlib.models.backbone.REMAT_POLICIES.
    c.remat_policy = "full"
    # Compute dtype of the matmuls, attention and norms: auto | float32 | bfloat16 | float16.
    # Parameters, optimizer state, the residual stream, softmax statistics, the head, loss and
    # metrics stay float32. auto = bfloat16 where the step runs on TPU or GPU (their matrix
    # units are built for half precision), float32 on CPU (sptlib.models.build.compute_dtype).
    c.dtype = "auto"
    # Initialisation of the dense projections (encoder, attention, FFN, heads): linen (fan-in
    # truncated normal, zero biases) | torch (PyTorch's nn.Linear / nn.TransformerEncoderLayer
    # defaults); see sptlib.layers.initializers. Norms, embeddings and SSM parameters are
    # unaffected.
    c.init_scheme = "linen"
    # GELU of the FFN, SSM blocks and retrieval head: True = tanh approximation (Flax's default,
    # faster on CPU) | False = exact (erf; PyTorch's nn.GELU, the paper code's).
    c.gelu_approximate = True
    # Residual-branch dropout with one mask per (example, feature), shared by every position
    # (state-spaces/s4 `tie_dropout`); False = independent per position.
    c.tie_dropout = False
    # Classifier head: hidden width of an MLP on the pooled features (0 = one linear map) and its
    # activation (relu | gelu); the paper code's `sequence_nonelinear` decoder is d_model / relu.
    c.head_hidden = 0
    c.head_activation = "gelu"
    # Mixer-specific options, passed to the mixer constructor.
    # Attention: impl is the algorithm (plain | chunked | local; sptlib.layers.attention);
    # the platform's fused kernel behind it is chosen automatically, kernel="reference" forces
    # the jnp one (benchmarks only). head_dim 0 = d_model // n_heads.
    c.attention = ml_collections.ConfigDict(
        dict(n_heads=4, positions="none", impl="plain", kernel="auto", window=0, chunk_size=512,
             head_dim=0))
    c.s4 = ml_collections.ConfigDict(dict(d_state=64))
    c.s4d = ml_collections.ConfigDict(dict(d_state=64, init_kind="lin", discretization="zoh"))
    c.dss = ml_collections.ConfigDict(dict(d_state=64, version="exp", init_kind="legs"))
    c.dlr = ml_collections.ConfigDict(dict(d_state=1024))
    c.s5 = ml_collections.ConfigDict(dict(d_state=64, init_kind="legs"))
    c.gss = ml_collections.ConfigDict(dict(d_state=512, expansion=4, d_ssm=0))
    # Mamba: state N per channel, d_inner = expand * d_model, dt_rank 0 = ceil(d_model / 16);
    # Mamba-2: head_dim must divide expand * d_model, n_groups the heads; chunk_size of the scans.
    c.mamba = ml_collections.ConfigDict(dict(d_state=16, expand=2, d_conv=4, dt_rank=0,
                                             chunk_size=64))
    c.mamba2 = ml_collections.ConfigDict(dict(d_state=64, expand=2, d_conv=4, head_dim=64,
                                              n_groups=1, chunk_size=64))
    # The linear-attention family (sptlib.layers.linear_rnn; docs/models.md): n_heads heads of
    # key width expand_k * d_model / n_heads and value width expand_v * d_model / n_heads;
    # use_short_conv: SiLU(causal depthwise conv of width d_conv) on q, k, v (zoology's "fair
    # comparison"); use_output_gate: SiLU(W_g x) times the per-head RMSNorm'd read-out;
    # chunk_size of the chunked kernels (sptlib.kernels.linear_rnn).
    # GLA: gate per key channel logsigmoid(low-rank proj of rank gate_low_rank_dim) / normaliser.
    c.gla = ml_collections.ConfigDict(dict(n_heads=4, expand_k=0.5, expand_v=1.0,
                                           gate_low_rank_dim=16, gate_logit_normalizer=16.0,
                                           use_short_conv=True, d_conv=4, use_output_gate=True,
                                           chunk_size=64))
    # RetNet: fixed decay 1 - 2^(-5-h) of head h (no xPos).
    c.retnet = ml_collections.ConfigDict(dict(n_heads=8, expand_k=1.0, expand_v=2.0,
                                              use_short_conv=True, d_conv=4,
                                              use_output_gate=True, chunk_size=64))
    # DeltaNet: the delta rule, beta = sigmoid(proj) per head, L2-normalised q and k.
    c.deltanet = ml_collections.ConfigDict(dict(n_heads=4, expand_k=1.0, expand_v=1.0,
                                                use_short_conv=True, d_conv=4,
                                                use_output_gate=False, chunk_size=64))
    # Gated DeltaNet: the delta rule with Mamba-2's decay per head (A_log, dt_bias: the "ssm"
    # group); allow_neg_eigval doubles beta (transition eigenvalues in [-1, 1]).
    c.gated_deltanet = ml_collections.ConfigDict(dict(n_heads=4, expand_k=0.75, expand_v=1.5,
                                                      use_short_conv=True, d_conv=4,
                                                      use_output_gate=True,
                                                      allow_neg_eigval=False, chunk_size=64))
    # mLSTM (xLSTM): up-projection by expand, n_heads heads of d_inner / n_heads, the short
    # convolution on the q/k branch, exponential input and sigmoid forget gates per head.
    c.mlstm = ml_collections.ConfigDict(dict(n_heads=4, expand=2.0, use_short_conv=True,
                                             d_conv=4, chunk_size=64))
    # RWKV-7: heads of head_dim (must divide d_model), token shift, low-rank decay / in-context
    # learning rate / gate of ranks *_low_rank_dim (0 = fla's default from d_model).
    c.rwkv7 = ml_collections.ConfigDict(dict(head_dim=64, decay_low_rank_dim=0,
                                             a_low_rank_dim=0, gate_low_rank_dim=0,
                                             chunk_size=64))
    # Hyena: order N gated long convolutions, implicit filters = an FFN of filter_order of
    # emb_dim positional features with an exponential-decay window; short_kernel-wide causal
    # depthwise conv on the projections (sptlib.layers.hyena).
    c.hyena = ml_collections.ConfigDict(dict(order=2, filter_order=64, emb_dim=33,
                                             short_kernel=3))
    return c


# `dtype="auto"` by the platform the model runs on.
AUTO_DTYPE = {"tpu": "bfloat16", "gpu": "bfloat16", "cuda": "bfloat16", "rocm": "bfloat16"}


def resolve_dtype(name, platform=None):
    """`config.model.dtype` with ``auto`` resolved for `platform` (cpu | gpu | tpu; default:
    JAX's default backend, for a model built outside a resolved stage): the one place that
    decides it."""
    if name != "auto":
        return name
    if platform is None:
        import jax  # deferred: the config module itself stays JAX-free
        platform = jax.default_backend()
    return AUTO_DTYPE.get(platform, "float32")


def resolve_model_config(model_cfg, task_info, platform=None):
    """A copy of `config.model` with the data-dependent fields (0 = from the data) filled in.

    `task_info` is the task's `info` dict (vocab_size, max_length, input_type, d_input);
    `platform` (cpu | gpu | tpu; default: JAX's default backend) resolves ``dtype="auto"``.
    """
    m = ml_collections.ConfigDict(model_cfg.to_dict())
    m.dtype = resolve_dtype(m.dtype, platform)
    if not m.vocab_size:
        m.vocab_size = int(task_info.get("vocab_size", 0))
    if not m.max_length:
        m.max_length = int(task_info["max_length"])
    if task_info.get("input_type") == "continuous":
        m.d_input = int(task_info.get("d_input", m.d_input))
    return m
