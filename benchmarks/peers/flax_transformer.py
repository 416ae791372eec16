"""Plain Flax Linen Transformer classifier of the quickstart's size (no sptlib), one AdamW step.

The floor for sptlib's Transformer: the textbook model written directly with `nn.SelfAttention`,
`nn.LayerNorm`, `nn.Dense`, `optax.adamw`, `jax.jit` with the state donated. Same shape as
`torch_transformer`: linear encoder of `[batch, length, 2]`, sinusoidal positions, 2 pre-norm
layers of d_model 64, 4 heads, FFN 128 (GELU), final LayerNorm, mean pooling, linear classifier.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn


def sinusoidal(length, d_model):
    pos = np.arange(length)[:, None] / np.power(10000.0, np.arange(0, d_model, 2) / d_model)
    pe = np.zeros((length, d_model), np.float32)
    pe[:, 0::2], pe[:, 1::2] = np.sin(pos), np.cos(pos)
    return jnp.asarray(pe)


class Layer(nn.Module):
    n_heads: int
    d_ffn: int

    @nn.compact
    def __call__(self, x):
        x = x + nn.SelfAttention(num_heads=self.n_heads, deterministic=True)(nn.LayerNorm()(x))
        h = nn.Dense(self.d_ffn)(nn.LayerNorm()(x))
        return x + nn.Dense(x.shape[-1])(nn.gelu(h, approximate=False))


class Classifier(nn.Module):
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ffn: int = 128
    num_classes: int = 2

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(self.d_model)(x) + sinusoidal(x.shape[1], self.d_model)
        for _ in range(self.n_layers):
            h = Layer(self.n_heads, self.d_ffn)(h)
        return nn.Dense(self.num_classes)(nn.LayerNorm()(h).mean(axis=1))


def make_step(length, batch, seed=0, **sizes):
    """A closure running one jitted train step on a fixed synthetic batch; returns the loss."""
    model = Classifier(**sizes)
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.uniform(-1, 1, (batch, length, 1)),
                        np.zeros((batch, length, 1))], -1).astype(np.float32)
    x, y = jnp.asarray(x), jnp.asarray(rng.integers(0, model.num_classes, batch), jnp.int32)
    params = model.init(jax.random.PRNGKey(seed), x[:1])
    opt = optax.adamw(2e-3, weight_decay=0.01)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def train_step(params, opt_state, x, y):
        def loss_fn(p):
            logits = model.apply(p, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    state = [params, opt.init(params)]

    def step():
        state[0], state[1], loss = train_step(state[0], state[1], x, y)
        return loss
    return step
