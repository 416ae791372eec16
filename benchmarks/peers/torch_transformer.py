"""PyTorch Transformer classifier of the quickstart's size and one AdamW train step.

`torch.nn.TransformerEncoder` (pre-norm `norm_first=True`, GELU, no dropout) in the shape of
sptlib's quickstart Transformer (experiments/quickstart.py): a linear encoder of the pixel and its
mask channel, sinusoidal positions, 2 layers of d_model 64, 4 heads, FFN 128, a final LayerNorm,
mean pooling, a linear classifier, cross-entropy, AdamW (lr 2e-3, weight decay 0.01).
Inputs `[batch, length, 2]` float, labels `[batch]`.
"""

import torch
from torch import nn


def sinusoidal(length, d_model):
    pos = torch.arange(length)[:, None] / torch.pow(10000.0, torch.arange(0, d_model, 2) / d_model)
    pe = torch.zeros(length, d_model)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos), torch.cos(pos)
    return pe


class Classifier(nn.Module):
    def __init__(self, length, d_input=2, d_model=64, n_layers=2, n_heads=4, d_ffn=128,
                 num_classes=2):
        super().__init__()
        self.encoder = nn.Linear(d_input, d_model)
        self.register_buffer("pe", sinusoidal(length, d_model))
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ffn, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, x):
        h = self.norm(self.body(self.encoder(x) + self.pe))
        return self.head(h.mean(dim=1))


def make_step(length, batch, seed=0, device="cpu", **sizes):
    """A closure running one train step on a fixed synthetic batch on `device`; returns the loss
    tensor (on `device`: synchronise before reading the clock on a GPU)."""
    torch.manual_seed(seed)
    model = Classifier(length, **sizes).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    x = torch.cat([torch.rand(batch, length, 1) * 2 - 1, torch.zeros(batch, length, 1)], -1)
    x = x.to(device)
    y = torch.randint(0, model.head.out_features, (batch,)).to(device)

    def step():
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()
    return step
