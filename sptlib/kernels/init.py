"""Initialisers for SSM parameters: HiPPO-LegS (dense, normal-plus-low-rank), S4D inits, log dt.

Everything here runs in NumPy float64 at initialisation time and returns NumPy arrays; the
layers cast to float32 and store complex values as real (re, im) pairs.
"""

import numpy as np


def hippo_legs(n):
    """HiPPO-LegS matrices: A `[n, n]` (real, lower triangular) and B `[n]`.

    A_nk = -sqrt(2n+1) sqrt(2k+1) for n > k, -(n+1) for n = k, 0 above the diagonal;
    B_n = sqrt(2n+1).
    """
    q = np.sqrt(2.0 * np.arange(n) + 1.0)
    a = -np.tril(np.outer(q, q), -1) - np.diag(np.arange(n) + 1.0)
    return a, q.copy()


def nplr_legs(n):
    """Normal-plus-low-rank form of HiPPO-LegS, A = V (diag(Lambda) - p p^*) V^*.

    Returns (Lambda, p, b, V) for the n/2 eigenvalues with positive imaginary part (the other
    half are their conjugates, with conjugate p, b and eigenvectors): Lambda `[n/2]` complex
    (real part -1/2), p `[n/2]` = V^* P, b `[n/2]` = V^* B, V `[n, n/2]`.
    """
    if n % 2:
        raise ValueError(f"state size must be even, got {n}")
    a, b = hippo_legs(n)
    p = np.sqrt(np.arange(n) + 0.5)
    s = a + np.outer(p, p)  # = -1/2 I + skew-symmetric
    skew = s + 0.5 * np.eye(n)
    # -i * skew is Hermitian: eigh gives real frequencies and an orthonormal basis.
    w, v = np.linalg.eigh(-1j * skew)
    idx = np.argsort(w)[n // 2:]  # positive frequencies, ascending
    w, v = w[idx], v[:, idx]
    lam = -0.5 + 1j * w
    return lam, v.conj().T @ p, v.conj().T @ b, v


def s4d_init(n, kind="lin"):
    """Diagonal A `[n/2]` complex and B `[n/2]` complex for S4D (Gu et al. 2022, 'On the
    parameterization and initialization of diagonal state space models').

    lin: A_n = -1/2 + i pi n, B = 1; inv: A_n = -1/2 + i (n/pi)(n/(2k+1) - 1), B = 1;
    legs: the diagonal of the normal part of HiPPO-LegS, B projected onto its eigenbasis.
    (The unstructured `random` control is drawn per channel from the parameter key:
    `sptlib.layers.initializers.random_diagonal_inits`.)
    """
    h = n // 2
    k = np.arange(h)
    if kind == "lin":
        return -0.5 + 1j * np.pi * k, np.ones(h, np.complex128)
    if kind == "inv":
        return -0.5 + 1j * (n / np.pi) * (n / (2 * k + 1) - 1), np.ones(h, np.complex128)
    if kind == "legs":
        lam, _, b, _ = nplr_legs(n)
        return lam, b
    raise ValueError(f"unknown S4D init {kind!r} (lin | inv | legs)")
