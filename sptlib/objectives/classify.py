"""Supervised objectives: sequence classification and retrieval (a pair of documents -> class).

Each counts one per example (`example_mask`); metrics `"loss"` and `"accuracy"` as
`(sum, count)` pairs. `cfg.label_smoothing` smooths the cross-entropy's labels.
"""

import jax
import jax.numpy as jnp
import optax

from sptlib.objectives.base import Objective, apply_model, weighted_ce


class Classification(Objective):
    kind = "classify"

    def __init__(self, cfg, info, model_cfg, mask_channel):
        del model_cfg  # the head's size comes from the task
        super().__init__(cfg, {"kind": self.kind, "num_classes": int(info["num_classes"])},
                         mask_channel)

    def _loss(self, apply_fn, variables, batch, example, mask_rng, dropout_rng, train):
        kwargs = self.init_inputs(batch)
        logits, new_state = apply_model(apply_fn, variables, kwargs, dropout_rng, train)
        labels = jnp.asarray(batch["label"]).astype(jnp.int32)
        w = example.astype(jnp.float32)
        logits = logits.astype(jnp.float32)
        ls = float(self.cfg.label_smoothing)
        if ls > 0:
            n = logits.shape[-1]
            soft = optax.smooth_labels(jax.nn.one_hot(labels, n), ls)
            ce = optax.softmax_cross_entropy(logits, soft)
            loss_sum = jnp.sum(ce * w)
            correct = jnp.sum((jnp.argmax(logits, -1) == labels).astype(jnp.float32) * w)
        else:
            loss_sum, correct = weighted_ce(logits, labels, w)
        count = jnp.sum(w)
        metrics = {"loss": (loss_sum, count), "accuracy": (correct, count)}
        return loss_sum / jnp.maximum(count, 1.0), metrics, new_state


class Retrieval(Classification):
    """Classification of a document pair (`inputs`/`mask` and `inputs2`/`mask2`)."""
    kind = "retrieval"

    def __init__(self, cfg, info, model_cfg, mask_channel):
        if not info.get("pair", False):
            raise ValueError("retrieval objective needs a paired task (task_info['pair'])")
        super().__init__(cfg, info, model_cfg, mask_channel)

    def _loss(self, apply_fn, variables, batch, *args):
        if "inputs2" not in batch:
            raise ValueError("retrieval objective needs batch['inputs2'] and batch['mask2']")
        return super()._loss(apply_fn, variables, batch, *args)
