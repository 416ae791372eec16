"""Old name of `sptlib.layers.initializers`, kept while `sptlib/models/` still imports it."""

from sptlib.layers.initializers import SCHEMES, attention_in, check, dense, symmetric_uniform

__all__ = ["SCHEMES", "attention_in", "check", "dense", "symmetric_uniform"]
