"""Pure-jnp SSM kernels and FFT convolution (no Flax, no TensorFlow)."""
