"""The bag-of-words control: token embedding -> mean pooling -> MLP head, no sequence mixing.

`config.model.pattern = "bow"` builds `encoder -> BagOfWords -> ClassifyHead(d_hidden=d_model)`:
the "backbone" only zeroes padding (and, for continuous inputs, applies a GELU to the linear
encoder's output, so that mean pooling gives a learned soft histogram of the values rather than
their plain mean). With `positions = "none"` the pooled features, hence the logits, do not depend
on token order: the control tells whether a task needs sequence modelling at all.
"""

import flax.linen as nn
import jax.numpy as jnp


class BagOfWords(nn.Module):
    """`y = bow(x[batch, length, d_model], mask[batch, length] | None, *, deterministic)`:
    per-token features, zero at padding; no parameters, no mixing across positions."""
    nonlinear: bool = False

    @nn.compact
    def __call__(self, x, mask=None, *, deterministic=True):
        del deterministic  # no dropout
        if self.nonlinear:
            x = nn.gelu(x)
        if mask is not None:
            x = jnp.where(mask[..., None], x, 0)
        return x
