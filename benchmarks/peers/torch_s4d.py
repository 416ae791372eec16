"""PyTorch S4D block, written from the structure of state-spaces/s4 `models/s4/s4d.py`
(Gu, Gupta, Goel, Ré, "On the Parameterization and Initialization of Diagonal State Space
Models", 2022), dropout removed.

Kernel (ZOH, S4D-Lin init): A_n = -exp(log_A_real_n) + i A_imag_n, dt = exp(log_dt),
K_l = 2 Re sum_n C_n (exp(dt A_n) - 1) / A_n * exp(dt A_n l). Block: causal FFT convolution
(zero-padded to 2L), D skip, GELU, then a 1x1 convolution to 2H channels and a GLU.
Layout as the reference: `u` is `[batch, H, length]`. Every tensor the forward pass creates lives
on the parameters' device (`S4D(h).to("cuda")` runs on the GPU).
"""

import math

import torch
from torch import nn


class S4DKernel(nn.Module):
    """K `[H, L]` from diagonal complex parameters (conjugate pairs stored once)."""

    def __init__(self, h, n=64, dt_min=1e-3, dt_max=1e-1):
        super().__init__()
        log_dt = torch.rand(h) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
        self.log_dt = nn.Parameter(log_dt)
        self.c = nn.Parameter(torch.view_as_real(torch.randn(h, n // 2, dtype=torch.cfloat)))
        self.log_a_real = nn.Parameter(torch.log(0.5 * torch.ones(h, n // 2)))
        self.a_imag = nn.Parameter(math.pi * torch.arange(n // 2).float().repeat(h, 1))

    def forward(self, length):
        dt = torch.exp(self.log_dt)[:, None]
        a = -torch.exp(self.log_a_real) + 1j * self.a_imag
        dta = a * dt
        c = torch.view_as_complex(self.c) * (torch.exp(dta) - 1.0) / a
        pos = torch.arange(length, device=dta.device)                     # on the block's device
        vander = torch.exp(dta[..., None] * pos)                          # [H, N/2, L]
        return 2 * torch.einsum("hn,hnl->hl", c, vander).real


class S4D(nn.Module):
    """`[batch, H, L]` -> `[batch, H, L]`."""

    def __init__(self, h, n=64):
        super().__init__()
        self.d = nn.Parameter(torch.randn(h))
        self.kernel = S4DKernel(h, n)
        self.act = nn.GELU()
        self.out = nn.Sequential(nn.Conv1d(h, 2 * h, kernel_size=1), nn.GLU(dim=-2))

    def forward(self, u):
        length = u.size(-1)
        k = self.kernel(length)
        k_f = torch.fft.rfft(k, n=2 * length)
        u_f = torch.fft.rfft(u, n=2 * length)
        y = torch.fft.irfft(u_f * k_f, n=2 * length)[..., :length]
        return self.out(self.act(y + u * self.d[:, None]))
