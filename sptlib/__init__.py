"""sptlib: fair comparison of long-sequence models through self-pretraining (SPT).

Layers, from the bottom up (lower layers never import upper ones):
kernels (pure jnp) -> layers (Flax Linen) -> models -> objectives -> train -> stages.
"""

__version__ = "0.1.0"
