"""Accelerator slices described and compiled for without the hardware.

`meshes` (JAX-free mesh presets per slice: data / fsdp / model sizes), `topologies` (the TPU
topologies libtpu can compile for on a CPU host), `aot` (every stage of a config lowered and
compiled for its slice: memory per chip and the compiler's step-time bound).
"""
