"""Mesh presets for common TPU slices and GPU hosts, and a portable device-array builder.

A mesh config is the `config.mesh` ConfigDict of docs/architecture.md ("Mesh"):

    data, fsdp, tensor   axis sizes inside one slice (ICI); one of them may be -1 = fill with the
                         devices left over
    dcn_data, dcn_fsdp   how many slices the data / fsdp axes span (DCN, multi-slice only)

The mesh built from it has the axes `("data", "fsdp", "tensor")` with sizes
`(dcn_data * data, dcn_fsdp * fsdp, tensor)`: the DCN factor is the outer (slow) part of an axis,
so gradients are reduced over ICI first and cross the data-centre network once per step.

Preset names follow Cloud TPU accelerator types, optionally prefixed by a slice count:
`v4-8`, `v4-32`, `v4-128`, `v5e-16` (alias `v5litepod-16`), `v5p-16`, `v6e-8`, `2xv5e-16`,
`4xv4-32`; plus `gpu-8` (one host, 8 GPUs), `2xgpu-8` (two hosts over DCN) and `cpu`.
The number in a TPU name is what Cloud TPU sells: TensorCores for v2/v3/v4/v5p, chips for
v5e/v6e. JAX sees one device per chip on megacore generations (v4, v5p), so a `v4-32` is
16 JAX devices on 4 hosts, not 32.

    >>> cfg = mesh_preset("2xv5e-16")
    >>> (cfg.data, cfg.fsdp, cfg.tensor, cfg.dcn_data, cfg.dcn_fsdp)
    (16, 1, 1, 2, 1)
    >>> expected_device_count("v4-32")
    16
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Sequence

import ml_collections
import numpy as np

# The one home of the mesh axis names (sptlib.train.sharding and the launchers use these).
MESH_AXES = ("data", "fsdp", "tensor")
ICI_KEYS = MESH_AXES  # config.mesh keys of the per-slice axis sizes
DCN_KEYS = ("dcn_data", "dcn_fsdp")

# Per TPU generation: how the number in the accelerator name converts to JAX devices, how many
# JAX devices one host (TPU VM worker) drives, and the default TPU VM runtime (software) version.
# v4/v5p are megacore (2 TensorCores fused into 1 device, the name counts cores); v5e/v6e names
# count chips; v2/v3 expose every core as a device.
_TPU_GENERATIONS = {
    #         name units per device, devices per host, runtime version
    "v2": (1, 8, "tpu-ubuntu2204-base"),
    "v3": (1, 8, "tpu-ubuntu2204-base"),
    "v4": (2, 4, "tpu-ubuntu2204-base"),
    "v5p": (2, 4, "v2-alpha-tpuv5"),
    "v5e": (1, 4, "v2-alpha-tpuv5-lite"),
    "v6e": (1, 4, "v2-alpha-tpuv6e"),
}
_ALIASES = {"v5litepod": "v5e"}
# v5e / v6e slices of up to 8 chips are single-host machines with all chips on one VM.
_SINGLE_HOST_LITE_MAX = 8

_NAME_RE = re.compile(r"^(?:(?P<slices>\d+)x)?(?P<gen>[a-z0-9]+?)-(?P<size>\d+)$")


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """A parsed preset name, e.g. `2xv5e-16` -> generation v5e, size 16, 2 slices."""

    name: str               # the preset name as given (aliases normalised)
    generation: str         # v2 | v3 | v4 | v5p | v5e | v6e | gpu | cpu
    size: int               # the number in the name (0 for cpu)
    num_slices: int         # slices (TPU) or hosts (GPU) joined over DCN
    devices_per_slice: int  # JAX devices in one slice (0 for cpu = whatever is there)
    hosts_per_slice: int    # TPU VM workers / GPU hosts per slice

    @property
    def num_devices(self) -> int:
        """JAX devices in the whole job (`jax.device_count()`); 0 for `cpu` (any)."""
        return self.devices_per_slice * self.num_slices

    @property
    def num_hosts(self) -> int:
        return self.hosts_per_slice * self.num_slices

    @property
    def accelerator_type(self) -> str:
        """The Cloud TPU `--accelerator-type` of one slice, e.g. `v5litepod-16`."""
        if self.generation not in _TPU_GENERATIONS:
            raise ValueError(f"{self.name!r} is not a TPU slice")
        gen = "v5litepod" if self.generation == "v5e" else self.generation
        return f"{gen}-{self.size}"

    @property
    def runtime_version(self) -> str:
        """The default TPU VM runtime version for this generation."""
        if self.generation not in _TPU_GENERATIONS:
            raise ValueError(f"{self.name!r} is not a TPU slice")
        return _TPU_GENERATIONS[self.generation][2]


def parse_accelerator(name: str) -> Accelerator:
    """Parses a preset name (`v4-32`, `2xv5e-16`, `v5litepod-16`, `gpu-8`, `2xgpu-8`, `cpu`)."""
    key = name.strip().lower()
    if key == "cpu":
        return Accelerator("cpu", "cpu", 0, 1, 0, 1)
    match = _NAME_RE.match(key)
    if not match:
        raise ValueError(
            f"Unknown mesh preset {name!r}; expected e.g. 'v4-32', '2xv5e-16', 'gpu-8' or 'cpu'")
    num_slices = int(match["slices"] or 1)
    gen = _ALIASES.get(match["gen"], match["gen"])
    size = int(match["size"])
    if num_slices < 1 or size < 1:
        raise ValueError(f"Mesh preset {name!r}: slice count and size must be positive")
    if gen == "gpu":
        devices, hosts = size, 1
    elif gen in _TPU_GENERATIONS:
        per_device, per_host, _ = _TPU_GENERATIONS[gen]
        if size % per_device:
            raise ValueError(f"{name!r}: a {gen} slice size must be a multiple of {per_device}")
        devices = size // per_device
        if gen in ("v5e", "v6e") and devices <= _SINGLE_HOST_LITE_MAX:
            hosts = 1
        else:
            hosts = max(1, math.ceil(devices / per_host))
    else:
        raise ValueError(
            f"Unknown accelerator generation {match['gen']!r} in {name!r}; known: "
            f"{sorted(_TPU_GENERATIONS) + sorted(_ALIASES) + ['gpu', 'cpu']}")
    prefix = f"{num_slices}x" if num_slices > 1 else ""
    return Accelerator(f"{prefix}{gen}-{size}", gen, size, num_slices, devices, hosts)


def mesh_preset(name: str, *, fsdp: int = 1, tensor: int = 1,
                dcn_axis: str = "data") -> ml_collections.ConfigDict:
    """Returns the mesh config `{data, fsdp, tensor, dcn_data, dcn_fsdp}` for a slice name.

    Inside a slice the devices go to `data` unless `fsdp` / `tensor` take a share
    (`data = devices_per_slice / (fsdp * tensor)`); across slices the DCN axis is `dcn_axis`
    (`data`, the default: only gradients cross DCN, once per step; or `fsdp`). Sizes are explicit
    (no -1) so that running on the wrong slice fails at start-up with both device counts named.
    `cpu` gives `data=-1`: every local device.
    """
    acc = parse_accelerator(name)
    cfg = ml_collections.ConfigDict(
        {"data": -1, "fsdp": fsdp, "tensor": tensor, "dcn_data": 1, "dcn_fsdp": 1})
    if acc.generation == "cpu":
        return cfg
    per_slice = acc.devices_per_slice
    if fsdp < 1 or tensor < 1 or per_slice % (fsdp * tensor):
        raise ValueError(
            f"Mesh preset {acc.name!r}: fsdp={fsdp} x tensor={tensor} must divide the "
            f"{per_slice} devices of one slice")
    cfg.data = per_slice // (fsdp * tensor)
    if dcn_axis not in ("data", "fsdp"):
        raise ValueError(f"dcn_axis must be 'data' or 'fsdp', got {dcn_axis!r}")
    cfg[f"dcn_{dcn_axis}"] = acc.num_slices
    return cfg


def expected_device_count(name: str) -> int | None:
    """JAX devices a preset expects (`jax.device_count()`), or None for `cpu` (any number)."""
    acc = parse_accelerator(name)
    return acc.num_devices or None


PRESETS = ("cpu", "v4-8", "v4-32", "v4-128", "v5e-16", "2xv5e-16", "gpu-8", "2xgpu-8")


def resolve_axis_sizes(mesh_cfg: Any, num_devices: int) -> dict[str, int]:
    """Fills a -1 axis and checks that the mesh uses exactly `num_devices` devices.

    Returns `{data, fsdp, tensor, dcn_data, dcn_fsdp}` with positive sizes. Raises ValueError
    naming both the mesh's device count and `num_devices` when they differ.
    """
    sizes = {k: int(mesh_cfg[k]) for k in ICI_KEYS + DCN_KEYS if k in mesh_cfg}
    for k in ICI_KEYS + DCN_KEYS:
        sizes.setdefault(k, 1)
    for k in DCN_KEYS:
        if sizes[k] < 1:
            raise ValueError(f"mesh.{k} must be a positive slice count, got {sizes[k]}")
    num_slices = sizes["dcn_data"] * sizes["dcn_fsdp"]
    fill = [k for k in ICI_KEYS if sizes[k] == -1]
    if len(fill) > 1 or any(sizes[k] < 1 for k in ICI_KEYS if k not in fill):
        raise ValueError(
            f"mesh axes {dict((k, sizes[k]) for k in ICI_KEYS)}: sizes must be positive, "
            "at most one may be -1")
    fixed = math.prod(sizes[k] for k in ICI_KEYS if k not in fill) * num_slices
    if fill:
        if num_devices % fixed:
            raise ValueError(
                f"mesh {_describe(sizes)} cannot fill -1: the fixed axes use {fixed} devices, "
                f"which does not divide the {num_devices} devices available")
        sizes[fill[0]] = num_devices // fixed
    total = math.prod(sizes[k] for k in ICI_KEYS) * num_slices
    if total != num_devices:
        raise ValueError(
            f"mesh {_describe(sizes)} needs {total} devices, but {num_devices} devices are "
            "available (jax.device_count()); pick the preset for this slice or change config.mesh")
    return sizes


def _describe(sizes: dict[str, int]) -> str:
    return ", ".join(f"{k}={sizes[k]}" for k in ICI_KEYS + DCN_KEYS)


class _SliceView:
    """A device seen with a `slice_index` (for platforms, like CPU and GPU, that have none)."""

    def __init__(self, device, slice_index: int):
        self.device = device
        self.slice_index = slice_index

    def __getattr__(self, name):
        return getattr(self.device, name)


def _assign_slices(devices: Sequence[Any], num_slices: int) -> list[_SliceView]:
    """Splits devices into `num_slices` equal contiguous groups.

    Multi-process (e.g. one process per GPU under Slurm): groups whole processes, so that with
    Slurm's block task distribution one group is one host. Single process (fake CPU devices in
    tests): groups devices by id.
    """
    processes = sorted({d.process_index for d in devices})
    if len(processes) > 1:
        if len(processes) % num_slices:
            raise ValueError(
                f"{len(processes)} processes cannot be split evenly into {num_slices} slices")
        per = len(processes) // num_slices
        slice_of = {p: i // per for i, p in enumerate(processes)}
        return [_SliceView(d, slice_of[d.process_index]) for d in devices]
    ordered = sorted(devices, key=lambda d: d.id)
    per = len(ordered) // num_slices
    return [_SliceView(d, i // per) for i, d in enumerate(ordered)]


def device_array(mesh_cfg: Any, devices: Sequence[Any] | None = None) -> np.ndarray:
    """Arranges devices as `[dcn_data * data, dcn_fsdp * fsdp, tensor]` for `jax.sharding.Mesh`.

    One slice: `mesh_utils.create_device_mesh` (topology-aware on TPU, a reshape elsewhere).
    Several slices: `mesh_utils.create_hybrid_device_mesh`, which groups devices by their
    `slice_index` (set on multi-slice TPU). CPU and GPU devices have no `slice_index`; they are
    given one by `_assign_slices` (whole processes per slice, or contiguous device ids in a single
    process), so the same hybrid code path is exercised on fake CPU devices in tests.
    """
    import jax  # Deferred: importing this module must not start a JAX backend.
    from jax.experimental import mesh_utils

    devices = list(jax.devices() if devices is None else devices)
    sizes = resolve_axis_sizes(mesh_cfg, len(devices))
    ici = [sizes[k] for k in ICI_KEYS]
    dcn = [sizes["dcn_data"], sizes["dcn_fsdp"], 1]
    num_slices = math.prod(dcn)
    if num_slices == 1:
        return mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
    if all(hasattr(d, "slice_index") for d in devices):
        found = len({d.slice_index for d in devices})
        if found != num_slices:
            raise ValueError(
                f"mesh {_describe(sizes)} spans {num_slices} slices over DCN, but the devices "
                f"belong to {found} slices")
        return mesh_utils.create_hybrid_device_mesh(
            ici, dcn, devices, allow_split_physical_axes=True)
    views = _assign_slices(devices, num_slices)
    arr = mesh_utils.create_hybrid_device_mesh(ici, dcn, views, allow_split_physical_axes=True)
    return np.vectorize(lambda v: v.device, otypes=[object])(arr)


def build_mesh(mesh_cfg: Any, devices: Sequence[Any] | None = None):
    """A `jax.sharding.Mesh` with axes `("data", "fsdp", "tensor")` (Auto axis types)."""
    return mesh_of(device_array(mesh_cfg, devices))


def mesh_of(device_arr):
    """A `jax.sharding.Mesh` over a `[data, fsdp, tensor]` device array (Auto axis types)."""
    import jax  # Deferred: importing this module must not start a JAX backend.

    return jax.sharding.Mesh(device_arr, MESH_AXES,
                             axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


def slice_mesh(config) -> Any:
    """`config.mesh` as the config runs on its target slice: `config.aot.tensor` / `.fsdp`
    (when non-zero) replace the local mesh's axes; data parallelism fills the rest."""
    mesh = type(config.mesh)(config.mesh.to_dict())
    for axis in ("tensor", "fsdp"):
        if int(config.aot.get(axis, 0) or 0):
            mesh[axis] = int(config.aot[axis])
    return mesh


def config_overrides(mesh_cfg: Any, prefix: str = "config.mesh") -> list[str]:
    """Command-line overrides (`--config.mesh.data=16`, ...) that select this mesh.

    Used by the launchers so that any experiment config runs with a preset without editing it.
    """
    return [f"--{prefix}.{k}={int(mesh_cfg[k])}" for k in ICI_KEYS + DCN_KEYS]


def summary(name: str) -> str:
    """One line per preset fact, for `python -m sptlib.slices.meshes NAME` and the launchers' logs."""
    acc = parse_accelerator(name)
    cfg = mesh_preset(name)
    mesh = ", ".join(f"{k}={cfg[k]}" for k in ICI_KEYS + DCN_KEYS)
    if acc.generation == "cpu":
        return f"cpu: every local device on the data axis ({mesh})"
    return (f"{acc.name}: {acc.num_slices} slice(s) x {acc.devices_per_slice} devices on "
            f"{acc.hosts_per_slice} host(s) each = {acc.num_devices} devices, "
            f"{acc.num_hosts} processes; mesh {mesh}")


def _main(argv: Sequence[str]) -> None:
    for name in argv[1:] or PRESETS:
        print(summary(name))


if __name__ == "__main__":
    import sys

    _main(sys.argv)
