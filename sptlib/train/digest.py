"""Content digests of what a checkpoint holds, recorded at save time and checked at restore.

A checkpoint step folder holds, beside `state/`, `data/` and `metrics/`, the item `digest/`
(orbax JSON, written with the others and committed with them):

    {"version": 1,
     "arrays":  {"params/backbone/w": "<sha256 of dtype, shape and bytes>", ...},
     "data":    "<sha256 of the data item's JSON>",
     "metrics": "<sha256 of the metrics' JSON>" | null}

The digest of an array is over its full value (gathered across processes when sharded), so it is
independent of the mesh it is restored onto. It is computed once per save from the host copy of
the state, never in a train step. A restore (`sptlib.train.checkpoint`) and `init_from`
(`sptlib.train.transfer`) compare what they read with it: a mismatch is a damaged checkpoint
(`sptlib.errors.CheckpointDigestError`), even when every file has the right size.

The data item records `"digest": 1`, so a checkpoint whose digest item was lost is told from one
written before digests existed (those are restored unverified, with a warning).
"""

import hashlib
import json
from typing import Any, Optional

from etils import epath
import jax
import numpy as np

from sptlib.errors import CheckpointDigestError

ITEM = "digest"
VERSION = 1
FILE = "metadata"  # orbax's JSON handler writes <step>/<item>/metadata


def leaf_names(path) -> tuple:
    """('params', 'backbone', 'w') of a key path (attribute, dict key or index)."""
    parts = []
    for k in path:
        for attr in ("name", "key", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
    return tuple(parts)


def leaf_path(path) -> str:
    """'params/backbone/w' of a key path, as `checkpoint_io.leaf_specs`."""
    return "/".join(leaf_names(path))


def array_digest(value) -> str:
    """SHA-256 over an array's dtype, shape and bytes (a host NumPy array)."""
    value = np.ascontiguousarray(value)
    h = hashlib.sha256()
    h.update(str(value.dtype).encode())
    h.update(str(tuple(value.shape)).encode())
    h.update(value.tobytes())
    return h.hexdigest()


def array_digests(tree, to_host) -> dict:
    """{path: digest} of every array leaf of `tree`; `to_host(x)` gives a leaf's full value.

    Every process must call it (sharded leaves are all-gathered one at a time)."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            out[leaf_path(path)] = array_digest(to_host(leaf))
    return out


def json_digest(obj: Any) -> Optional[str]:
    """SHA-256 of `obj`'s canonical JSON (None for None): what a JSON item reads back as."""
    if obj is None:
        return None
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=True,
                      default=lambda x: x.item() if hasattr(x, "item") else str(x))
    return hashlib.sha256(text.encode()).hexdigest()


def make(state, data_item: dict, metrics: Optional[dict], to_host) -> dict:
    """The digest item of one save."""
    return {"version": VERSION, "arrays": array_digests(state, to_host),
            "data": json_digest(data_item), "metrics": json_digest(metrics)}


def read(step_dir) -> Optional[dict]:
    """The digest recorded in `step_dir`, or None when the checkpoint predates digests.

    Raises:
      CheckpointDigestError: the digest item is unreadable, or missing although the data item
        says one was written.
    """
    step_dir = epath.Path(step_dir)
    path = step_dir / ITEM / FILE
    if not path.exists():
        data = step_dir / "data" / FILE
        try:
            expected = bool(json.loads(data.read_text()).get(ITEM)) if data.exists() else False
        except (ValueError, UnicodeDecodeError, AttributeError):
            expected = False  # the data item itself is unreadable: the restore says so
        if expected:
            raise CheckpointDigestError(f"{step_dir}: its digest ({ITEM}/{FILE}) is missing")
        return None
    try:
        rec = json.loads(path.read_text())
        if not isinstance(rec, dict) or not isinstance(rec.get("arrays"), dict):
            raise ValueError("not a digest record")
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointDigestError(f"{path} is unreadable ({e})") from None
    return rec


def check_arrays(recorded: dict, actual: dict, where, *, subset: bool = False) -> None:
    """Raises `CheckpointDigestError` naming the first array whose digest differs.

    `subset`: `actual` holds only some of the arrays (a partial restore, `init_from`)."""
    saved = recorded.get("arrays", {})
    keys = sorted(actual) if subset else sorted(set(saved) | set(actual))
    for key in keys:
        if saved.get(key) != actual.get(key):
            if key not in saved:
                what = "is not in its digest"
            elif key not in actual:
                what = "was not restored"
            else:
                what = "differs from the digest recorded when it was saved"
            raise CheckpointDigestError(
                f"{where}: array {key!r} {what} (the checkpoint's files are damaged)")


def check_json(recorded: dict, field: str, obj: Any, where) -> None:
    """Raises `CheckpointDigestError` when the JSON item `field` differs from its digest."""
    if field in recorded and recorded[field] != json_digest(obj):
        raise CheckpointDigestError(f"{where}: its {field} item differs from the digest recorded "
                                    f"when it was saved (the checkpoint's files are damaged)")
