"""Pure-jnp kernels: SSM kernels, FFT convolution, attention (no Flax, no TensorFlow).

`linear_rnn` holds the matrix-state linear RNNs (gated linear attention, the (gated) delta rule,
RWKV-7, mLSTM) in chunkwise-parallel form, each with a step and a sequential reference.

Every SSM kernel function returns a real kernel `[..., channels, length]` (leading dims for
several output matrices, e.g. the two directions of a bidirectional layer) and has a recurrent
reference (a step-by-step scan of the same discretised system) used by the tests.
"""

from sptlib.kernels.attention import chunked_attention, dot_product_attention, rotary_embedding
from sptlib.kernels.conv import (
    bidirectional_kernel_spectrum, direct_conv, fft_conv, fft_conv_bidirectional, fft_size,
    ssm_conv)
from sptlib.kernels.diagonal import (
    diagonal_recurrence, diagonal_step, dlr_kernel, dlr_log_lambda, dlr_recurrent_kernel,
    dss_discretize, dss_kernel, dss_recurrent_kernel, impulse_response, s4d_discretize,
    s4d_kernel, s4d_recurrent_kernel, vandermonde_sum)
from sptlib.kernels.init import hippo_legs, nplr_legs, s4d_init
from sptlib.kernels.linear_rnn import (
    delta_rule, delta_rule_reference, delta_rule_step, gated_linear_attention,
    gated_linear_attention_reference, gated_linear_attention_step, mlstm, mlstm_reference,
    mlstm_step, rwkv7, rwkv7_reference, rwkv7_step)
from sptlib.kernels.s4 import (
    s4_dense, s4_full, s4_kernel, s4_output_matrix, s4_recurrent_kernel, s4_step)
from sptlib.kernels.s5 import s5_discretize, s5_input, s5_output, s5_recurrent, s5_scan

__all__ = [
    "chunked_attention", "dot_product_attention", "rotary_embedding",
    "bidirectional_kernel_spectrum", "direct_conv", "fft_conv", "fft_conv_bidirectional",
    "fft_size", "ssm_conv", "diagonal_recurrence", "diagonal_step", "dlr_kernel", "dlr_log_lambda",
    "dlr_recurrent_kernel", "dss_discretize", "dss_kernel", "dss_recurrent_kernel",
    "impulse_response", "s4d_discretize", "s4d_kernel", "s4d_recurrent_kernel", "vandermonde_sum",
    "hippo_legs", "delta_rule", "delta_rule_reference", "delta_rule_step",
    "gated_linear_attention", "gated_linear_attention_reference", "gated_linear_attention_step",
    "mlstm", "mlstm_reference", "mlstm_step", "rwkv7", "rwkv7_reference", "rwkv7_step", "nplr_legs", "s4d_init", "s4_dense", "s4_full", "s4_kernel", "s4_output_matrix",
    "s4_recurrent_kernel", "s4_step", "s5_discretize", "s5_input", "s5_output", "s5_recurrent",
    "s5_scan",
]
