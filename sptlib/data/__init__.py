"""Data: LRA readers and TFDS builders, generators, offline data, tokenisers, grain pipelines."""
