"""Training engine: optimiser, sharding, checkpoints, metrics and the jit train loop."""
