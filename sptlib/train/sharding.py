"""Device mesh, logical-axis rules, global batches and multi-host initialisation.

The mesh always has the three axes `sptlib.slices.meshes.MESH_AXES`, `("data", "fsdp", "tensor")`. On a
multi-slice system the `data` and `fsdp` axes additionally span slices (`dcn_data`, `dcn_fsdp`):
the device array is built by `sptlib.slices.meshes.device_array`, so the axis size seen by the program
is `dcn_data * data` (resp. `dcn_fsdp * fsdp`).

Parameters carry logical axis names (docs/architecture.md); `default_rules()` maps them onto mesh
axes: the batch over `(data, fsdp)`, parameters' `embed` dimension over `fsdp` (ZeRO-3 style: each
fsdp shard keeps a slice of every weight and its optimizer state), and the "wide" dimensions
(`mlp`, `heads`, `vocab`, `ssm_channels`) over `tensor` (Megatron style). Flax assigns a mesh axis
at most once per array (first matching rule wins), so activations `[batch, length, embed]` get
the batch sharding and a replicated `embed`.
"""

import logging
import math
import os

import jax
import ml_collections
import numpy as np
from flax import linen as nn
from jax.sharding import NamedSharding, PartitionSpec as P

from sptlib.slices import meshes


def mesh_config():
    """Returns the default `config.mesh`: all devices on the data axis, one slice, one host."""
    c = ml_collections.ConfigDict()
    # Per-slice (ICI) axis sizes; one of them may be -1 = all remaining devices.
    c.data = -1
    c.fsdp = 1
    c.tensor = 1
    # Number of slices along data / fsdp (multi-slice TPU over DCN); 1 on a single slice.
    c.dcn_data = 1
    c.dcn_fsdp = 1
    # Multi-host start-up (`maybe_initialize_distributed`): an explicit coordinator
    # "host:port" with num_processes / process_id, or "" to let JAX auto-detect a cluster
    # (TPU pod, SLURM, ...) when the environment says there is one.
    c.coordinator_address = ""
    c.num_processes = 0
    c.process_id = -1
    # Seconds to wait for all processes to join.
    c.initialization_timeout = 300
    return c


def default_rules():
    """Logical axis name -> mesh axis (or tuple of axes, or None) rules, in priority order.

    Returns:
      A list of `(logical name, mesh axes)` pairs usable by `flax.linen.logical_to_mesh_*`.
    """
    return [
        ("batch", ("data", "fsdp")),
        ("length", None),
        ("vocab", "tensor"),
        ("mlp", "tensor"),
        ("heads", "tensor"),
        ("ssm_channels", "tensor"),
        ("embed", "fsdp"),
        ("kv", None),
        ("ssm_state", None),
        ("classes", None),
        ("norm", None),
    ]


def normalize_rules(rules):
    """Turns config rules (lists from ConfigDict/JSON) into a tuple of `(name, axes)` tuples."""
    if rules is None:
        rules = default_rules()
    out = []
    for rule in rules:
        name, axes = rule
        if isinstance(axes, (list, tuple)):
            axes = tuple(axes) if len(axes) > 1 else (axes[0] if axes else None)
        out.append((name, axes))
    return tuple(out)


def create_mesh(mesh_cfg, devices=None):
    """Builds the `("data", "fsdp", "tensor")` mesh described by `mesh_cfg`.

    The device arrangement (topology-aware on TPU, hybrid ICI x DCN for multi-slice, also on
    fake CPU devices) is `sptlib.slices.meshes.device_array`'s.

    Args:
      mesh_cfg: `config.mesh` (see `mesh_config`).
      devices: devices to use (default: all, `jax.devices()`).

    Returns:
      A `jax.sharding.Mesh` with auto axis types (so `jax.jit` shardings and GSPMD propagation
      behave as with the classic API).

    Raises:
      ValueError: if the axis sizes do not multiply to the device count (names both numbers).
    """
    devices = list(jax.devices() if devices is None else devices)
    # Checks sizes first so a wrong mesh is always a ValueError naming both device counts.
    meshes.resolve_axis_sizes(mesh_cfg, len(devices))
    try:
        return meshes.build_mesh(mesh_cfg, devices)
    except (NotImplementedError, AssertionError):
        # Device subsets of unknown topology (e.g. 1 of 8 fake CPU devices): a plain reshape.
        sizes = meshes.resolve_axis_sizes(mesh_cfg, len(devices))
        shape = [sizes["dcn_data"] * sizes["data"], sizes["dcn_fsdp"] * sizes["fsdp"],
                 sizes["tensor"]]
        return meshes.mesh_of(np.asarray(devices, dtype=object).reshape(shape))


def _multihost_env():
    """True when the environment describes a multi-process job JAX can auto-detect."""
    # Set by sptlib/launch/tpu.py: on Cloud TPU VMs the worker list comes from the VM metadata server,
    # which no environment variable reveals, so the launcher says so explicitly.
    if os.environ.get("SPTLIB_DISTRIBUTED", "") == "1":
        return True
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return True
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    if hosts and len(hosts.split(",")) > 1:
        return True
    if int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1 and os.environ.get("SLURM_JOB_ID"):
        return True
    if int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1:
        return True
    return False


def is_main_process():
    """True on the process that writes logs and files (process 0)."""
    return jax.process_index() == 0


def maybe_initialize_distributed(cfg):
    """Calls `jax.distributed.initialize` when this is a multi-process run; else nothing.

    Must run before anything touches a JAX backend. Takes either the full config (uses
    `cfg.mesh`) or the mesh config itself. Idempotent.
    """
    mesh_cfg = cfg.mesh if "mesh" in cfg else cfg
    if jax.distributed.is_initialized():
        return
    address = mesh_cfg.get("coordinator_address", "") or ""
    if address:
        num = int(mesh_cfg.get("num_processes", 0))
        pid = int(mesh_cfg.get("process_id", -1))
        if num < 1 or pid < 0:
            raise ValueError(
                f"coordinator_address={address!r} needs num_processes >= 1 and process_id >= 0, "
                f"got {num} and {pid}")
        kwargs = {}
        if address.split(":")[0] in ("127.0.0.1", "localhost"):
            # A loopback job (tests, one machine) must not listen on every interface.
            kwargs["coordinator_bind_address"] = address
        jax.distributed.initialize(
            address, num, pid,
            initialization_timeout=int(mesh_cfg.get("initialization_timeout", 300)), **kwargs)
    elif _multihost_env():
        jax.distributed.initialize()
    else:
        return
    logging.info("jax.distributed initialised: process %d of %d, %d local / %d global devices",
                 jax.process_index(), jax.process_count(), jax.local_device_count(),
                 jax.device_count())


def batch_axes(rules):
    """The mesh axes the logical `batch` axis maps to (a tuple, possibly empty)."""
    spec = nn.logical_to_mesh_axes(("batch",), normalize_rules(rules))
    axes = spec[0]
    if axes is None:
        return ()
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def batch_sharding(mesh, rules):
    """NamedSharding for batch arrays: leading (batch) dimension split over the batch axes."""
    axes = batch_axes(rules)
    return NamedSharding(mesh, P(axes if axes else None))


def shard_batch(local_batch, mesh, rules):
    """Assembles global `jax.Array`s from each process's slice of the batch.

    Args:
      local_batch: dict of NumPy arrays `[local_batch, ...]`, this process's consecutive share
        of the global batch (process i holds rows `[i * local_batch, (i + 1) * local_batch)`
        when every process feeds the same amount).
      mesh: the training mesh.
      rules: logical axis rules (the `batch` rule decides the split).

    Returns:
      dict of global arrays `[local_batch * process_count, ...]`, sharded on the batch dimension.
    """
    sharding = batch_sharding(mesh, rules)
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
            for k, v in local_batch.items()}


def logical_to_sharding(logical_specs, shapes, mesh, rules):
    """Maps logical PartitionSpecs to NamedShardings, replicating dims that do not divide.

    Args:
      logical_specs: pytree of `PartitionSpec`s of logical axis names (or None).
      shapes: pytree with the same structure whose leaves have `.shape`.
      mesh: the mesh.
      rules: logical axis rules.

    Returns:
      pytree of `NamedSharding`.
    """
    rules = normalize_rules(rules)

    def one(spec, leaf):
        shape = tuple(getattr(leaf, "shape", ()))
        if spec is None:
            return NamedSharding(mesh, P())
        mesh_spec = list(nn.logical_to_mesh_axes(tuple(spec), rules))
        for i, axes in enumerate(mesh_spec):
            if axes is None or i >= len(shape):
                continue
            names = axes if isinstance(axes, tuple) else (axes,)
            size = math.prod(mesh.shape[a] for a in names)
            if shape[i] % size:
                # Uneven shards would force padding; keep the dimension whole instead.
                logging.info("dim %d of shape %s (logical %s) not divisible by %s=%d: replicated",
                             i, shape, spec, names, size)
                mesh_spec[i] = None
        return NamedSharding(mesh, P(*mesh_spec))

    return jax.tree.map(one, logical_specs, shapes,
                        is_leaf=lambda x: isinstance(x, P) or x is None)


def replicated(mesh):
    """A fully replicated NamedSharding on `mesh`."""
    return NamedSharding(mesh, P())
