r"""The SPT → finetune protocol in PyTorch, fed sptlib's own randomness (optional: needs torch).

    python benchmarks/fidelity/torch_spt_paired.py /tmp/rand_s1.npz   # from dump_randomness.py

`torch.nn.TransformerEncoder` (pre-norm, 4 heads, FFN × 2, dropout 0), a linear encoder of
[value, mask indicator], sinusoidal positions, final LayerNorm; AdamW (lr 2e-3, weight decay
0.01 on every parameter), lr warmup from 0 over 60 steps then cosine to 0 (optax's schedule);
50% masked pixels with 256-way targets for the dumped pretraining steps, validation masked loss
every 100 steps, finetuning from the best of those with the dumped fresh head, mean pooling,
validation and test accuracy every 100 steps. Starting parameters, batches and masks are
sptlib's (the file); sptlib's layout choices are followed where PyTorch's default differs: the
sinusoidal table is [sin | cos] halves, and the FFN uses tanh GELU (Flax's default).
Prints one JSON line per evaluation and a final line with the test accuracy at the best
validation accuracy.
"""

import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

LR, WEIGHT_DECAY, WARMUP, EVAL_EVERY = 2e-3, 0.01, 60, 100


class Body(nn.Module):
    def __init__(self, length, d_model, n_layers, n_heads=4):
        super().__init__()
        self.enc = nn.Linear(2, d_model)
        half = d_model // 2
        freq = torch.exp(-math.log(10000.0) * torch.arange(half) / half)
        angles = torch.arange(length)[:, None] * freq
        self.register_buffer("pe", torch.cat([torch.sin(angles), torch.cos(angles)], -1))
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, 2 * d_model, dropout=0.0, batch_first=True, norm_first=True,
            activation=lambda x: F.gelu(x, approximate="tanh"))
        self.body = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x):  # [batch, length, 2] -> [batch, length, d_model]
        return self.norm(self.body(self.enc(x) + self.pe))


def adamw(params, steps):
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY)

    def set_lr(step):
        if step < WARMUP:
            f = step / WARMUP
        else:
            f = 0.5 * (1 + math.cos(math.pi * min(step - WARMUP, steps - WARMUP)
                                    / (steps - WARMUP)))
        for g in opt.param_groups:
            g["lr"] = LR * f
    return opt, set_lr


def with_mask_channel(x, masked=None):
    """[batch, length] values -> [batch, length, 2]: masked values zeroed, indicator appended."""
    if masked is None:
        masked = torch.zeros_like(x, dtype=torch.bool)
    return torch.stack([x * ~masked, masked.float()], -1)


def main(path):
    r = np.load(path)
    t = {k: torch.tensor(r[k]) for k in r.files}
    pre_steps, _, length = t["pretrain.x"].shape
    d_model = t["init.enc.weight"].shape[0]
    n_layers = len({k.split(".")[3] for k in t if k.startswith("init.body.layers.")})
    body = Body(length, d_model, n_layers)
    state = {k[5:]: v for k, v in t.items()
             if k.startswith("init.") and not k.startswith("init.head.")}
    body.load_state_dict(dict(state, pe=body.pe), strict=True)
    head = nn.Linear(d_model, 256)
    cls = nn.Linear(d_model, int(t["val.y"].max()) + 1)
    with torch.no_grad():
        head.weight.copy_(t["init.head.weight"]); head.bias.copy_(t["init.head.bias"])
        cls.weight.copy_(t["fthead.weight"]); cls.bias.copy_(t["fthead.bias"])
    t0 = time.time()

    opt, set_lr = adamw(list(body.parameters()) + list(head.parameters()), pre_steps)
    best_pre = None
    for step in range(pre_steps):
        set_lr(step)
        m = t["pretrain.mask"][step]
        logits = head(body(with_mask_channel(t["pretrain.x"][step], m)))
        loss = F.cross_entropy(logits[m], t["pretrain.raw"][step].long()[m])
        opt.zero_grad(); loss.backward(); opt.step()
        if (step + 1) % EVAL_EVERY == 0:
            with torch.no_grad():
                total = count = 0.0
                for i in range(0, len(t["val.x"]), 250):
                    vm = t["val.mask"][i:i + 250]
                    out = head(body(with_mask_channel(t["val.x"][i:i + 250], vm)))
                    total += F.cross_entropy(out[vm], t["val.raw"][i:i + 250].long()[vm],
                                             reduction="sum").item()
                    count += vm.sum().item()
            if best_pre is None or total / count < best_pre[0]:
                best_pre = (total / count, step + 1,
                            {k: v.clone() for k, v in body.state_dict().items()})
            print(json.dumps({"stage": "pretrain", "step": step + 1,
                              "val_loss": round(total / count, 5),
                              "wall_s": round(time.time() - t0, 1)}), flush=True)
    if best_pre is not None:
        body.load_state_dict(best_pre[2])

    def accuracy(split):
        correct = 0
        with torch.no_grad():
            for i in range(0, len(t[split + ".y"]), 250):
                out = cls(body(with_mask_channel(t[split + ".x"][i:i + 250])).mean(1))
                correct += (out.argmax(-1) == t[split + ".y"][i:i + 250]).sum().item()
        return 100.0 * correct / len(t[split + ".y"])

    ft_steps = t["finetune.x"].shape[0]
    opt, set_lr = adamw(list(body.parameters()) + list(cls.parameters()), ft_steps)
    best = (-1.0, 0.0, 0)
    for step in range(ft_steps):
        set_lr(step)
        logits = cls(body(with_mask_channel(t["finetune.x"][step])).mean(1))
        loss = F.cross_entropy(logits, t["finetune.y"][step])
        opt.zero_grad(); loss.backward(); opt.step()
        if (step + 1) % EVAL_EVERY == 0:
            val, test = accuracy("val"), accuracy("test")
            if val > best[0]:
                best = (val, test, step + 1)
            print(json.dumps({"stage": "finetune", "step": step + 1, "val": val, "test": test,
                              "wall_s": round(time.time() - t0, 1)}), flush=True)
    print(json.dumps({"final": True, "file": path,
                      "pretrain_best_step": best_pre[1] if best_pre else None,
                      "best_val": best[0], "test_at_best": best[1], "best_step": best[2]}))


if __name__ == "__main__":
    main(sys.argv[1])
