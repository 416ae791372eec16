"""Reference blocks of other libraries, timed side by side with sptlib by
`python -m sptlib.bench --peer torch` (never imported by sptlib itself, its tests or CI).

- `torch_s4d`: the S4D block of state-spaces/s4 `models/s4/s4d.py` (PyTorch).
- `torch_s4`: the S4 block of state-spaces/s4 `models/s4/s4.py` (`S4Block`, mode `dplr`, with
  the pure-PyTorch fallback Cauchy kernel used on CPU).
- `torch_transformer`: a `torch.nn.TransformerEncoder` classifier (pre-norm, GELU) of the
  quickstart's size, one AdamW train step.
- `flax_transformer`: the same classifier as a plain Flax Linen model (no sptlib), the floor
  sptlib's Transformer must not fall below.

PyTorch is optional: a CPU-only build is enough, e.g. `pip install torch==2.13.0` (or
`pip install torch --index-url https://download.pytorch.org/whl/cpu`).
"""
