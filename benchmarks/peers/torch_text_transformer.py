"""PyTorch Text Transformer pretraining step: the model of `lra.py:text,transformer,spt-masked`'s
first stage (masked-token denoising), one AdamW step.

The paper's size by default: byte vocabulary (256 bytes + the 2 reserved ids, `sptlib.vocab`),
L 4096, token embedding plus sinusoidal positions, 6 pre-norm layers of d_model 512 with 8 heads
and a GELU FFN of 2048, a final LayerNorm and a per-token linear head to the vocabulary;
cross-entropy at the 15% masked positions (replaced by `<mask>` = 1 in the input), AdamW.
Attention is `torch.nn.functional.scaled_dot_product_attention` (its flash / memory-efficient
kernels on a GPU). `dtype="bfloat16"` runs the forward pass under `torch.autocast` (parameters
and optimizer state stay fp32); `"float32"` allows TF32 matmuls on CUDA, PyTorch's usual fast fp32.

    step = make_step(4096, 8, device="cuda", dtype="bfloat16")
    step()   # one train step; returns the loss tensor (synchronise before reading a clock)
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

BYTE_VOCAB = 258  # sptlib.data.tokenizers.BYTE_VOCAB_SIZE: 2 reserved ids + 256 bytes
MASK_ID = 1
PAPER = dict(d_model=512, n_layers=6, n_heads=8, d_ffn=2048, vocab=BYTE_VOCAB)


def sinusoidal(length, d_model):
    pos = torch.arange(length, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32)
                    * (-math.log(10000.0) / d_model))
    pe = torch.zeros(length, d_model)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    return pe


class Block(nn.Module):
    def __init__(self, d_model, n_heads, d_ffn):
        super().__init__()
        self.n_heads = n_heads
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.wi, self.wo = nn.Linear(d_model, d_ffn), nn.Linear(d_ffn, d_model)

    def forward(self, x):
        b, length, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, length, 3, self.n_heads, d // self.n_heads) \
            .permute(2, 0, 3, 1, 4)                                    # 3 x [B, H, L, D]
        o = F.scaled_dot_product_attention(q, k, v)                    # bidirectional
        x = x + self.out(o.transpose(1, 2).reshape(b, length, d))
        return x + self.wo(F.gelu(self.wi(self.norm2(x)), approximate="tanh"))


class TextTransformer(nn.Module):
    """tokens `[batch, length]` -> logits `[batch, length, vocab]`."""

    def __init__(self, length, d_model=512, n_layers=6, n_heads=8, d_ffn=2048, vocab=BYTE_VOCAB):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.register_buffer("pe", sinusoidal(length, d_model))
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ffn) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pe
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h).float())  # the head in fp32, as sptlib's TokenHead


def flops_per_step(length, batch, d_model=512, n_layers=6, n_heads=8, d_ffn=2048,
                   vocab=BYTE_VOCAB):
    """Matmul FLOPs of one forward+backward (3x the forward): projections, FFN, the two
    attention products and the head, 2 per multiply-add (the embedding lookup is not a matmul)."""
    del n_heads
    per_token = n_layers * (2 * 4 * d_model * d_model + 2 * 2 * d_model * d_ffn
                            + 2 * 2 * length * d_model) + 2 * d_model * vocab
    return 3.0 * per_token * length * batch


def make_step(length, batch, *, device="cpu", dtype="float32", seed=0, mask_rate=0.15, lr=1e-4,
              **sizes):
    """A closure running one AdamW train step on a fixed synthetic batch on `device`."""
    sizes = {**PAPER, **sizes}
    torch.manual_seed(seed)
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = TextTransformer(length, **sizes).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    g = torch.Generator().manual_seed(seed)
    targets = torch.randint(2, sizes["vocab"], (batch, length), generator=g)
    masked = torch.rand(batch, length, generator=g) < mask_rate
    tokens = torch.where(masked, torch.full_like(targets, MASK_ID), targets).to(dev)
    targets, weights = targets.to(dev), masked.float().to(dev)
    autocast = dtype in ("bfloat16", "bf16")

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(tokens)
        ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
        loss = (ce * weights.flatten()).sum() / weights.sum().clamp(min=1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()
    return step
