"""Benchmark suite: `python -m sptlib.bench [--quick] [--only mixers,train,pipeline,matmul]`.

Modules:
  common    timing (median after warm-up, `block_until_ready`), XLA memory / FLOP analysis,
            JSON-line records, machine description;
  mixers    every sequence mixer forward and forward+backward at 1k..16k, plain baselines
            (plain attention, direct convolution, sequential scan), S4D and scaling targets;
  train_step fp32 matmul peak, train steps of the experiment configs (tokens/s, compile, MFU);
  pipeline  input-pipeline examples/s against the train step's;
  markdown  Markdown tables for docs/benchmarks.md;
  peers     side by side with the PyTorch reference blocks (`--peer torch`), on the accelerator
            JAX runs on;
  accel     the accelerator report (`--accelerator-report [--tiny]`): Text Transformer step vs
            PyTorch, attention kernels, S4D, PathX / ListOps / GSS LM steps, TFLOP/s and memory.

Results: docs/benchmarks.md.
"""
