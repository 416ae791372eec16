"""The XLA:CPU kernels: C++ sources (`*.cc`, `common.h`, shipped as package data) compiled on
first use by `build`, and their JAX bindings. Imported only on CPU hosts."""
