"""PyTorch S4 block (DPLR), written from the structure of state-spaces/s4 `models/s4/s4.py`
(`S4Block` with `mode="dplr"`; Gu, Goel, Ré, "Efficiently Modeling Long Sequences with
Structured State Spaces", ICLR 2022), dropout removed, one channel, rank 1, unidirectional.

Kernel: the generating function of the bilinear-discretised DPLR SSM A = Lambda - P Q^*
(Q = conj P) evaluated at the roots of unity omega_k = exp(-2 pi i k / L),
z_k = 2 (1 - omega_k) / (1 + omega_k), by four Cauchy sums (the `cauchy_naive` fallback the
reference uses on CPU: a materialised `[.., N, L/2+1]` matrix, conjugate pairs expanded),
the Woodbury rank-1 correction k = r00 - r01 r10 / (1 + r11), times 2 / (1 + omega), and an
inverse real FFT. C is the already-transformed C~ (the reference folds (I - A^L) into C at set-up).
Block: causal FFT convolution (zero-padded to 2L), D skip, GELU, 1x1 convolution to 2H and GLU.

The initialisation is simplified to S4D-Lin eigenvalues and Gaussian P, B, C (the timing does
not depend on the values; HiPPO-LegS is what the reference uses). `u` is `[batch, H, length]`;
every tensor the forward pass creates lives on the parameters' device.
"""

import math

import torch
from torch import nn


def cauchy_naive(v, z, w):
    """sum_n v_n / (z_l - w_n) over both halves of the conjugate pairs.

    v `[..., N/2]`, z `[L']`, w `[..., N/2]` -> `[..., L']`.
    """
    v = torch.cat([v, v.conj()], dim=-1)
    w = torch.cat([w, w.conj()], dim=-1)
    return torch.sum(v[..., None] / (z - w[..., None]), dim=-2)


class S4DPLRKernel(nn.Module):
    def __init__(self, h, n=64, dt_min=1e-3, dt_max=1e-1):
        super().__init__()
        n2 = n // 2
        log_dt = torch.rand(h) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)
        self.log_dt = nn.Parameter(log_dt)
        self.log_a_real = nn.Parameter(torch.log(0.5 * torch.ones(h, n2)))
        self.a_imag = nn.Parameter(math.pi * torch.arange(n2).float().repeat(h, 1))

        def cplx(*shape):
            return nn.Parameter(torch.view_as_real(torch.randn(*shape, dtype=torch.cfloat)
                                                   * 0.5 ** 0.5))
        self.p, self.b, self.c = cplx(1, h, n2), cplx(1, h, n2), cplx(1, h, n2)

    def forward(self, length):
        dt = torch.exp(self.log_dt)
        a = -torch.exp(self.log_a_real) + 1j * self.a_imag                    # [H, N/2]
        p, b, c = (torch.view_as_complex(t) for t in (self.p, self.b, self.c))
        k = torch.arange(length // 2 + 1, device=dt.device)                   # the block's device
        omega = torch.exp(-2j * math.pi * k / length)
        z = 2 * (1 - omega) / (1 + omega)
        bp = torch.cat([b, p], dim=0)                                          # [2, H, N/2]
        cq = torch.cat([c, p.conj()], dim=0)                                   # [2, H, N/2]
        v = bp[:, None] * cq[None, :] * dt[:, None]                            # [2, 2, H, N/2]
        r = cauchy_naive(v, z, a * dt[:, None])                                # [2, 2, H, L']
        k_f = r[0, 0] - r[0, 1] * r[1, 0] / (1 + r[1, 1])
        k_f = k_f * 2 / (1 + omega)
        return torch.fft.irfft(k_f, n=length)                                  # [H, L]


class S4Block(nn.Module):
    """`[batch, H, L]` -> `[batch, H, L]`."""

    def __init__(self, h, n=64):
        super().__init__()
        self.d = nn.Parameter(torch.randn(h))
        self.kernel = S4DPLRKernel(h, n)
        self.act = nn.GELU()
        self.out = nn.Sequential(nn.Conv1d(h, 2 * h, kernel_size=1), nn.GLU(dim=-2))

    def forward(self, u):
        length = u.size(-1)
        k_f = torch.fft.rfft(self.kernel(length), n=2 * length)
        y = torch.fft.irfft(torch.fft.rfft(u, n=2 * length) * k_f, n=2 * length)[..., :length]
        return self.out(self.act(y + u * self.d[:, None]))
