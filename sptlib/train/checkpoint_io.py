"""Checkpoint file helpers below the checkpoint manager: tree metadata, iterator states, paths.

`sptlib.train.checkpoint` re-exports every public name here; import from there.
"""

import json
import os
from typing import Any, Optional

from absl import logging
from etils import epath
import flax
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from sptlib.train import digest


def encode_iterator_state(state: Any) -> dict:
    """Makes a data iterator's `get_state()` JSON-serialisable (grain gives a dict or bytes)."""
    if state is None:
        return {"format": "none"}
    if isinstance(state, (bytes, bytearray)):
        return {"format": "bytes", "value": bytes(state).decode("utf-8")}
    return {"format": "json", "value": state}


def decode_iterator_state(saved: dict) -> Any:
    fmt = saved.get("format")
    if fmt == "none":
        return None
    if fmt == "bytes":
        return saved["value"].encode("utf-8")
    if fmt == "json":
        return saved["value"]
    raise ValueError(f"unknown saved iterator state format {fmt!r}")


def gather_iterator_states(iterator_state: Any) -> dict:
    """Every process's encoded iterator state, as saved in `<step>/data` (written by process 0).

    Each process reads its own shard of the data, so each has its own position; orbax writes JSON
    items from the primary process only, hence the all-gather.
    """
    encoded = encode_iterator_state(iterator_state)
    if jax.process_count() == 1:
        return {"process_count": 1, "states": [encoded]}
    blob = np.frombuffer(json.dumps(encoded).encode("utf-8"), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([blob.size], np.int64)))
    sizes = sizes.reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:blob.size] = blob
    blobs = np.asarray(multihost_utils.process_allgather(padded))
    return {"process_count": int(sizes.size),
            "states": [json.loads(bytes(blobs[i, :sizes[i]]).decode("utf-8"))
                       for i in range(sizes.size)]}


def local_iterator_state(saved: dict) -> Any:
    """This process's iterator state from a saved `<step>/data` item."""
    if "states" not in saved:  # a single state (older layout)
        return decode_iterator_state(saved)
    states, n = saved["states"], int(saved["process_count"])
    if n != jax.process_count():
        logging.warning("The checkpoint's data iterator states come from %d processes, this run "
                        "has %d: every process starts from process 0's position (the data order "
                        "differs from an uninterrupted run).", n, jax.process_count())
        return decode_iterator_state(states[0])
    return decode_iterator_state(states[jax.process_index()])


def abstract_like(tree, shardings=None):
    """`ShapeDtypeStruct` targets (with shardings) for restoring `tree` onto the current mesh.

    Args:
      tree: a pytree of arrays (e.g. a freshly initialised `TrainState`).
      shardings: a matching pytree of `jax.sharding.Sharding`; default: each array's own.
    """
    if shardings is None:
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def to_host(x) -> np.ndarray:
    """A full NumPy copy of a (possibly multi-process sharded) array."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if x.sharding.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(jax.device_get(x))


def _flat(tree) -> dict:
    """{'a/b/c': leaf} of a nested dict (empty dicts dropped)."""
    if not tree:
        return {}
    return flax.traverse_util.flatten_dict(flax.serialization.to_state_dict(tree), sep="/")


def leaf_specs(tree) -> dict:
    """{'params/backbone/w': (shape, dtype name)} of every array leaf of `tree`.

    Works alike on a live `TrainState` (attribute / namedtuple keys) and on the nested dicts and
    lists of orbax's saved metadata, so the two can be compared key by key."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            out[digest.leaf_path(path)] = (tuple(int(d) for d in leaf.shape),
                                           np.dtype(leaf.dtype).name)
    return out


def describe_mismatch(saved: dict, wanted: dict) -> Optional[str]:
    """The first difference between two `leaf_specs` (checkpoint vs this config), or None.

    Parameters are looked at first (their names say most), then model state, then the rest."""
    rank = lambda k: (0 if k.startswith("params/") else 1 if k.startswith("model_state/") else 2,
                      k)  # noqa: E731
    for key in sorted(set(saved) | set(wanted), key=rank):
        if key not in wanted:
            return f"{key!r} (shape {saved[key][0]}) is in the checkpoint but not in this model"
        if key not in saved:
            return f"{key!r} (shape {wanted[key][0]}) is in this model but not in the checkpoint"
        if saved[key] != wanted[key]:
            (s_shape, s_dtype), (w_shape, w_dtype) = saved[key], wanted[key]
            return (f"{key!r} is {s_shape} {s_dtype} in the checkpoint but {w_shape} {w_dtype} "
                    f"in this config")
    return None


def absolute(path) -> epath.Path:
    """`path` as an absolute epath (orbax refuses relative local paths: "Checkpoint path should
    be absolute"); remote paths (gs://...) are returned unchanged."""
    text = str(path)
    if "://" in text:
        return epath.Path(text)
    return epath.Path(os.path.abspath(text))


def saved_tree(step_dir: epath.Path) -> dict:
    """The saved `TrainState`'s tree of array metadata (shapes, dtypes), read without arrays."""
    with ocp.PyTreeCheckpointer() as ckptr:
        meta = ckptr.metadata(step_dir / "state")
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    return dict(tree)
