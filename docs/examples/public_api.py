r"""sptlib's public API inside your own JAX code (docs/api.md): a mixer in your own Flax Linen
model and in an NNX model, and an SPT checkpoint's backbone loaded into your model.

    python docs/examples/public_api.py --stage <workdir>/pretrain

`--stage`: a stage folder of any sptlib run (e.g. the masked-SPT `pretrain` stage). Prints one
line per part; exits non-zero if the loaded backbone does not reproduce sptlib's own outputs.
"""

import argparse

import flax.linen as nn
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from sptlib import api


class MyClassifier(nn.Module):
    """Your model: your own embedding and head around an sptlib mixer."""
    num_classes: int = 3
    d_model: int = 16

    @nn.compact
    def __call__(self, x, mask, deterministic=True):
        h = nn.Dense(self.d_model)(x)  # [batch, length, d_model]
        mixer = api.get_mixer("s4d")(d_model=self.d_model, causal=False, dropout=0.0, d_state=8)
        h = h + mixer(nn.LayerNorm()(h), mask=mask, deterministic=deterministic)
        return nn.Dense(self.num_classes)(h.mean(axis=1))  # [batch, num_classes]


class WithPretrainedBackbone(nn.Module):
    """Your model around the backbone of an sptlib run (loaded below)."""
    model_cfg: dict
    num_classes: int = 2

    @nn.compact
    def __call__(self, h, mask, deterministic=True):
        h = api.build_backbone(self.model_cfg)(h, mask, deterministic=deterministic)
        return nn.Dense(self.num_classes)(h.mean(axis=1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stage", required=True, help="an sptlib stage folder (e.g. .../pretrain)")
    a = p.parse_args()
    rng = jax.random.PRNGKey(0)
    x = jax.random.normal(rng, (2, 32, 5))
    mask = jnp.ones((2, 32), bool)

    # 1. Linen: an sptlib mixer in your own model.
    model = MyClassifier()
    variables = model.init(rng, x, mask)
    print("linen:", model.apply(variables, x, mask).shape)

    # 2. NNX: the same Linen model through flax.nnx.bridge. sptlib's parameters carry logical
    # axis names for sharding; without a mesh, NNX must not place them eagerly.
    nnx.use_eager_sharding(False)
    nnx_model = nnx.bridge.ToNNX(MyClassifier(), rngs=nnx.Rngs(0))
    nnx.bridge.lazy_init(nnx_model, x, mask)
    print("nnx:", nnx_model(x, mask).shape)

    # 3. An SPT checkpoint's backbone in your model (Linen, then NNX).
    params, model_cfg = api.load_backbone(a.stage)
    cfg = model_cfg.to_dict()
    h = jax.random.normal(rng, (2, 24, model_cfg.d_model))
    hmask = jnp.ones((2, 24), bool)
    mine = WithPretrainedBackbone(cfg)
    v = mine.init(rng, h, hmask)
    v = {"params": {**v["params"], "Backbone_0": params}}  # the pretrained tensors, as saved
    reference = api.build_backbone(model_cfg).apply({"params": params}, h, hmask,
                                                    deterministic=True)
    out = mine.apply(v, h, hmask)

    def head_of(reference, dense):  # what your head makes of sptlib's own backbone outputs
        return np.asarray(reference.mean(axis=1) @ dense["kernel"] + dense["bias"])
    np.testing.assert_allclose(np.asarray(out), head_of(reference, v["params"]["Dense_0"]),
                               rtol=1e-4, atol=1e-5)
    print("checkpoint -> linen:", out.shape, f"({sum(x.size for x in jax.tree.leaves(params))} "
          f"backbone parameters from {a.stage})")

    nnx_mine = nnx.bridge.ToNNX(WithPretrainedBackbone(cfg), rngs=nnx.Rngs(0))
    nnx.bridge.lazy_init(nnx_mine, h, hmask)
    state = nnx.state(nnx_mine, nnx.Param)
    loaded = state
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        node = loaded["Backbone_0"]
        for k in path:
            node = node[k.key]
        node.set_value(jnp.asarray(leaf))
    nnx.update(nnx_mine, loaded)
    dense = {k: np.asarray(p.get_value()) for k, p in loaded["Dense_0"].items()}
    np.testing.assert_allclose(np.asarray(nnx_mine(h, hmask)), head_of(reference, dense),
                               rtol=1e-4, atol=1e-5)
    print("checkpoint -> nnx:", nnx_mine(h, hmask).shape)

if __name__ == "__main__":
    main()
