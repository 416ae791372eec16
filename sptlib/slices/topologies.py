"""TPU slices for ahead-of-time compilation: chip layout, HBM and peak FLOP/s per chip.

`slice_spec("v4-32")` names everything `sptlib.protocol.aot` needs to compile for a slice on a machine
without TPUs: the topology string and chip configuration that
`jax.experimental.topologies.get_topology_desc` takes (needs libtpu: `pip install -e '.[tpu]'`),
the number of JAX devices, and the chip's HBM and peak bf16 FLOP/s (Cloud TPU system
architecture pages). Slice names are Cloud TPU accelerator types, as in `sptlib.slices.meshes`: the
number counts TensorCores on v4 / v5p (2 per chip, one JAX device per chip) and chips on v5e.
The chip layouts follow MaxText's `accelerator_to_spec_map.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys

from jax.experimental import topologies as jax_topologies

from sptlib.slices import meshes

GIB = 1024 ** 3

# generation: (topology prefix, chip config, HBM bytes per chip, peak bf16 FLOP/s per chip,
#              {chips in the slice: chip grid})
_GENERATIONS = {
    "v4": ("v4", "megacore", 32 * GIB, 275e12,
           {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
            256: "4x8x8", 512: "8x8x8"}),
    "v5p": ("v5", "megacore", 95 * GIB, 459e12,
            {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
             256: "4x8x8", 512: "8x8x8"}),
    "v5e": ("v5e", "default", 16 * GIB, 197e12,
            {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
             256: "16x16"}),
}
# Chips attached to one host (TPU VM worker) in the grid's dimensions.
_HOST_BOUNDS = {1: (1, 1, 1), 8: (2, 4, 1)}  # v5e single-host shapes; everything else 2x2x1


@dataclasses.dataclass(frozen=True)
class SliceSpec:
    name: str                 # e.g. "v4-32"
    generation: str           # v4 | v5p | v5e
    num_devices: int          # JAX devices = chips
    topology: str             # get_topology_desc's topology_name, e.g. "v4:2x2x4"
    chip_config: str          # megacore | default
    chips_per_host: tuple     # chips_per_host_bounds
    hbm_bytes: int            # per chip
    peak_flops: float         # bf16 FLOP/s per chip


def names() -> list[str]:
    """Every known slice name, e.g. ['v4-8', ..., 'v5e-1', ...]."""
    out = []
    for gen, (_, chip_config, _, _, grids) in _GENERATIONS.items():
        per_chip = 2 if chip_config == "megacore" else 1
        out += [f"{gen}-{chips * per_chip}" for chips in grids]
    return out


def slice_spec(name: str) -> SliceSpec:
    """The `SliceSpec` of a single-slice name like `v4-32`, `v5e-16`, `v5p-8`.

    Raises:
      ValueError: unknown or unsupported names (the message lists the known ones).
    """
    try:
        acc = meshes.parse_accelerator(name)
    except ValueError as e:
        raise ValueError(f"unknown TPU slice {name!r} ({e}); known: {', '.join(names())}") \
            from None
    grids = _GENERATIONS.get(acc.generation, (None,) * 5)[4]
    if acc.num_slices != 1 or not grids or acc.devices_per_slice not in grids:
        raise ValueError(f"unknown TPU slice {name!r}; known single slices: {', '.join(names())}")
    prefix, chip_config, hbm, peak, _ = _GENERATIONS[acc.generation]
    chips = acc.devices_per_slice
    return SliceSpec(name=acc.name, generation=acc.generation, num_devices=chips,
                     topology=f"{prefix}:{grids[chips]}", chip_config=chip_config,
                     chips_per_host=_HOST_BOUNDS.get(chips, (2, 2, 1))
                     if acc.generation == "v5e" else (2, 2, 1),
                     hbm_bytes=hbm, peak_flops=peak)


def devices(spec: SliceSpec):
    """The slice's JAX devices, compile-only (from libtpu; no TPU needed on this machine)."""
    # Other JAX processes on this machine may hold libtpu's lock file; compiling needs no lock.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    with _stderr_to_devnull():
        desc = jax_topologies.get_topology_desc(platform="tpu", topology_name=spec.topology,
                                                chip_config_name=spec.chip_config,
                                                chips_per_host_bounds=spec.chips_per_host,
                                                num_slices=1)
    devs = list(desc.devices)
    if len(devs) != spec.num_devices:
        raise RuntimeError(f"{spec.name}: libtpu gave {len(devs)} devices for topology "
                           f"{spec.topology}, expected {spec.num_devices}")
    return devs


@contextlib.contextmanager
def _stderr_to_devnull():
    """Silences libtpu's start-up warnings (written by C++ to fd 2) about the TPU VM metadata
    (accelerator type, worker hostnames) that a machine without TPUs cannot have. Errors still
    surface as Python exceptions."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
