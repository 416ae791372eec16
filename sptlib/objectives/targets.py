"""What a reconstruction objective (masked or causal SPT) predicts at a counted position.

- `tokens`: the token id (cross-entropy over the vocabulary; head `token_logits`);
- `pixel256`: each channel's raw value 0-255 (256-way cross-entropy; head `pixel_logits`);
- `l1`: each channel's normalised value (L1 error; head `regress`; no accuracy).

`make_target(name, info, model_cfg)` resolves `auto` from the task's input type.
"""

import jax.numpy as jnp

from sptlib.objectives.base import weighted_ce


class Target:
    """A reconstruction target.

    Attributes:
      name: tokens | pixel256 | l1.
      continuous: whether it needs continuous inputs (float `[batch, length, channels]`).
      head_cfg: the model head predicting it (`sptlib.models.build_model`).
    """
    name = ""
    continuous = True
    head_cfg: dict = {}

    def values(self, batch):
        """Targets at every position: `[batch, length]` ids or `[batch, length, channels]`."""
        raise NotImplementedError

    def score(self, out, targets, weights):
        """`(loss_sum, count, correct_sum | None)` over the weighted positions.

        Args:
          out: model output at the predicting positions: `[batch, length, vocab]` (tokens),
            `[batch, length, channels, 256]` (pixel256) or `[batch, length, channels]` (l1).
          targets: `values(batch)` at the same positions.
          weights: bool `[batch, length]`.
        """
        raise NotImplementedError


class Tokens(Target):
    name, continuous = "tokens", False

    def __init__(self, vocab_size: int):
        self.head_cfg = {"kind": "token_logits", "num_outputs": int(vocab_size)}

    def values(self, batch):
        return jnp.asarray(batch["inputs"])

    def score(self, out, targets, weights):
        w = weights.astype(jnp.float32)
        loss_sum, correct = weighted_ce(out, targets, w)
        return loss_sum, jnp.sum(w), correct


class _Channels(Target):
    """A continuous target: every (position, channel) pair of a weighted position counts."""

    def score(self, out, targets, weights):
        w = weights.astype(jnp.float32)
        wc = jnp.broadcast_to(w[..., None], targets.shape)
        count = jnp.sum(w) * targets.shape[-1]
        loss_sum, correct = self._sums(out, targets, wc)
        return loss_sum, count, correct

    def _sums(self, out, targets, wc):
        raise NotImplementedError


class Pixel256(_Channels):
    name = "pixel256"
    head_cfg = {"kind": "pixel_logits"}

    def values(self, batch):
        if "raw" not in batch:
            raise ValueError("target 'pixel256' needs batch['raw'] (pixel values 0-255)")
        return jnp.asarray(batch["raw"]).astype(jnp.int32)

    def _sums(self, out, targets, wc):
        return weighted_ce(out, targets, wc)


class L1(_Channels):
    name = "l1"
    head_cfg = {"kind": "regress"}

    def values(self, batch):
        return jnp.asarray(batch["inputs"]).astype(jnp.float32)

    def _sums(self, out, targets, wc):
        err = jnp.abs(out.astype(jnp.float32) - targets)
        return jnp.sum(err * wc), None


TARGETS = ("auto", "tokens", "pixel256", "l1")


def make_target(name, info, model_cfg) -> Target:
    """The target `name` (TARGETS) for the task's `info['input_type']` (tokens | continuous).

    `auto` is the task's `info['masked_target']` when it names one, else tokens for token inputs
    and pixel256 for continuous ones. The token head has
    `model_cfg.vocab_size` outputs, or `info['vocab_size']` when that is 0.
    """
    if name == "auto":  # a task may name its own (the user's real-valued files: l1)
        name = info.get("masked_target", "auto")
    if info.get("input_type", "tokens") == "tokens":
        if name not in ("auto", "tokens"):
            raise ValueError(f"target {name!r} needs continuous inputs; token inputs use 'tokens'")
        return Tokens(int(model_cfg.get("vocab_size", 0) or info["vocab_size"]))
    if name == "tokens":
        raise ValueError("target 'tokens' needs token inputs; continuous inputs use "
                         "pixel256 or l1")
    return L1() if name == "l1" else Pixel256()
