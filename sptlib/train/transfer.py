"""Parameter transfer between stages (`init_from`): which checkpoint, and loading it by name.

`resolve_init_checkpoint` finds the step folder a stage's `init_from` designates (the best-scoring
checkpoint by default); `load_pretrained` loads its parameters into a freshly initialised model,
every tensor checked by name and shape and, after placement, against the SHA-256 digest recorded
when the checkpoint was saved (`sptlib.train.digest`), so damaged files and a wrong path, cast or
resharding are all caught. Checkpoints written before digests are checked against a second,
independent read of the files instead (which cannot see damage on disk).
"""

import re
from typing import Iterable, Optional, Sequence

from absl import logging
from etils import epath
import flax
import jax
import numpy as np
import orbax.checkpoint as ocp

from sptlib.errors import (CheckpointDigestError, CheckpointError, IncompatibleCheckpointError,
                           NoCheckpointError)
from sptlib.train import digest as digest_lib
from sptlib.train import checkpoint as ckpt_lib
from sptlib.train.checkpoint import CHECKPOINTS_DIR
from sptlib.train.checkpoint_io import _flat, absolute, saved_tree, to_host


def resolve_init_checkpoint(init_from: str, workdir, which: str = "best") -> epath.Path:
    """The step folder that `init_from` designates.

    Args:
      init_from: a stage name (-> `workdir/<name>/checkpoints`), a stage folder (holding
        `checkpoints/`), a checkpoints folder (holding `<step>/` folders) or one step's folder.
      workdir: the run's workdir (for stage names).
      which: best (highest `score`; the latest if no checkpoint has metrics) | latest.
    """
    candidates = []
    if "/" not in init_from and workdir is not None:
        candidates.append(absolute(workdir) / init_from / CHECKPOINTS_DIR)
    path = absolute(init_from)
    candidates += [path / CHECKPOINTS_DIR, path]
    for cand in candidates:
        if not cand.exists():
            continue
        if ckpt_lib.is_step_dir(cand):
            return cand
        steps = sorted(int(p.name) for p in cand.iterdir() if ckpt_lib.is_step_dir(p))
        if steps:
            return cand / str(steps[-1] if which == "latest" else ckpt_lib.best_step(cand))
    raise NoCheckpointError(
        f"init_from={init_from!r}: no checkpoint found (looked in "
        f"{', '.join(str(c) for c in candidates)}). Run that stage first or fix the path.")


def _matches(path: str, patterns: Iterable[str]) -> Optional[str]:
    for pat in patterns:
        if re.search(pat, path):
            return pat
    return None


def load_pretrained(step_dir, params, model_state=None, *, dont_load: Sequence[str] = (),
                    verify: bool = True):
    """Loads parameters (and model state) from a checkpoint into a freshly initialised model:
    `plan_load` (which tensors, by name and shape), `restore_planned` (read them in place),
    `verify_loaded` (against the save-time digest).

    Every parameter of the model whose path (e.g. `backbone/layers_0/mixer/kernel`, relative to its
    collection) matches none of `dont_load` must exist in the checkpoint with the same shape; every
    checkpoint parameter that matches none must exist in the model. Matching ones keep their fresh
    values (model side) or are skipped (checkpoint side); each is logged.

    Args:
      step_dir: one checkpoint step folder (see `resolve_init_checkpoint`).
      params: the freshly initialised `params` (arrays with the target shardings).
      model_state: the fresh non-trainable collections (`{"batch_stats": ...}`) or {}/None.
      dont_load: regexes (re.search) of paths not to load.
      verify: check every tensor placed in the model against the checkpoint's save-time digest
        (or, for a checkpoint without one, bitwise against a second read of the files).

    Returns:
      (params, model_state, report) with report = {"checkpoint", "loaded", "not_loaded",
      "skipped_from_checkpoint", "verified"} (lists of paths; `not_loaded` keep their fresh init).

    Raises:
      IncompatibleCheckpointError: naming the first (sorted) mismatched parameter.
      CheckpointDigestError: a loaded tensor differs from the digest recorded at save time.
    """
    step_dir = absolute(step_dir)
    record = digest_lib.read(step_dir) if verify else None  # before reading: a lost digest stops
    targets = {"params": params, "model_state": model_state or {}}
    plan, report = plan_load(step_dir, targets, dont_load)
    out, report["loaded"] = restore_planned(step_dir, plan, targets)
    how = verify_loaded(step_dir, plan, out, record) if verify and plan else "not verified"
    for path in report["not_loaded"]:
        logging.info("init_from: %s not loaded (fresh init).", path)
    for path in report["skipped_from_checkpoint"]:
        logging.info("init_from: %s in the checkpoint skipped (dont_load).", path)
    logging.info("init_from %s: loaded %d tensors (%s), %d kept fresh, %d skipped.", step_dir,
                 len(report["loaded"]), how, len(report["not_loaded"]),
                 len(report["skipped_from_checkpoint"]))
    report["verified"] = how
    return out["params"], out["model_state"], report


def _shown(coll, path):
    return f"{coll}/{path}" if coll != "params" else path


def plan_load(step_dir, targets: dict, dont_load: Sequence[str]):
    """Which tensors to load, matched by name and shape: `({coll: {path: target leaf}},
    report)`; raises `IncompatibleCheckpointError` naming the first mismatch (sorted)."""
    saved = saved_tree(step_dir)
    report = {"checkpoint": str(step_dir), "loaded": [], "not_loaded": [],
              "skipped_from_checkpoint": []}
    plan, mismatches = {}, []
    for coll, target in targets.items():
        tflat = _flat(target)
        sflat = _flat(saved.get(coll, {}) or {})
        # Model state is best-effort: a collection absent from the checkpoint stays fresh.
        strict = coll == "params"
        for path in sorted(set(tflat) | set(sflat)):
            shown = _shown(coll, path)
            if _matches(path, dont_load):
                if path in tflat:
                    report["not_loaded"].append(shown)
                if path in sflat:
                    report["skipped_from_checkpoint"].append(shown)
            elif path not in sflat:
                if strict:
                    mismatches.append((shown, f"parameter {shown!r} (shape "
                                              f"{tuple(tflat[path].shape)}) is in the model but "
                                              f"not in the checkpoint"))
                else:
                    report["not_loaded"].append(shown)
            elif path not in tflat:
                mismatches.append((shown, f"parameter {shown!r} (shape "
                                          f"{tuple(sflat[path].shape)}) is in the checkpoint but "
                                          f"not in the model"))
            elif tuple(tflat[path].shape) != tuple(sflat[path].shape):
                mismatches.append((shown, f"parameter {shown!r} has shape "
                                          f"{tuple(sflat[path].shape)} in the checkpoint but "
                                          f"{tuple(tflat[path].shape)} in the model"))
            else:
                plan.setdefault(coll, {})[path] = tflat[path]
    if mismatches:
        mismatches.sort()
        # A hybrid stack loads only into the same layer list: name the first layer that differs.
        layer = re.match(r"backbone/layer_(\d+)/block/", mismatches[0][0])
        where = (f"layer {layer.group(1)} of the backbone differs (a hybrid stack loads only "
                 f"into the same config.model.layers): " if layer else "")
        raise IncompatibleCheckpointError(
            f"Checkpoint {step_dir} does not fit the model: {where}{mismatches[0][1]} "
            f"({len(mismatches)} mismatched parameter(s) in all; check d_model / n_layers / "
            f"mixer against the stage that wrote it, or add a dont_load pattern).")
    return plan, report


def _unflat(flat_items, leaf_fn):
    return flax.traverse_util.unflatten_dict(
        {tuple(k.split("/")): leaf_fn(v) for k, v in flat_items.items()})


def _read(step_dir, item):
    """A partial restore of `item` (a tree of `ShapeDtypeStruct`s) from `step_dir/state`."""
    with ocp.PyTreeCheckpointer() as ckptr:
        return ckptr.restore(step_dir / "state", args=ocp.args.PyTreeRestore(
            item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
            partial_restore=True))


def restore_planned(step_dir, plan: dict, targets: dict):
    """Reads the planned tensors onto their target shardings: `(trees, loaded paths)`, every
    target leaf not in the plan kept as it is."""
    item = {coll: _unflat(items, lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                sharding=x.sharding))
            for coll, items in plan.items()}
    try:
        restored = _read(step_dir, item)
    except Exception as e:  # pylint: disable=broad-except
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise CheckpointError(f"init_from: cannot read {step_dir / 'state'} ({type(e).__name__}: "
                              f"{first}); the checkpoint's files are damaged. Rerun the stage "
                              f"that wrote it, or point init_from / init_checkpoint at another "
                              f"checkpoint.") from None
    out, loaded = {}, []
    for coll, target in targets.items():
        tflat = dict(_flat(target))
        for path, value in (_flat(restored.get(coll, {})) if coll in restored else {}).items():
            tflat[path] = value
            loaded.append(_shown(coll, path))
        out[coll] = _unflat(tflat, lambda v: v) if tflat else type(target)()
    return out, loaded


def verify_loaded(step_dir, plan: dict, out: dict, record) -> str:
    """Checks what now sits in the model against what was saved (damaged files, a wrong path,
    cast or resharding cannot pass silently); returns how it was verified.

    `record`: the checkpoint's digest (`digest.read`); None for a checkpoint written before
    digests, checked instead bitwise against an independent read of the files as NumPy (which
    cannot see damage on disk)."""
    if record is not None:
        placed = {}
        for coll, items in plan.items():
            flat_out = _flat(out[coll])
            for path in items:
                placed[f"{coll}/{path}"] = digest_lib.array_digest(to_host(flat_out[path]))
        try:
            digest_lib.check_arrays(record, placed, step_dir, subset=True)
        except CheckpointDigestError as e:
            raise CheckpointDigestError(
                f"init_from: loaded parameter differs from the checkpoint file's save-time "
                f"digest: {e}. Rerun the stage that wrote it, or point init_from / "
                f"init_checkpoint at another checkpoint.") from None
        return "verified against the save-time digest"
    from_file = _read(step_dir, {coll: _unflat(items, lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype)) for coll, items in plan.items()})
    for coll in plan:
        placed = _flat(out[coll])
        for path, ref in _flat(from_file[coll]).items():
            got, ref = to_host(placed[path]), np.asarray(ref)
            if got.dtype != ref.dtype or got.shape != ref.shape or got.tobytes() != ref.tobytes():
                raise CheckpointDigestError(f"Loaded parameter {coll}/{path} differs from "
                                            f"the checkpoint file {step_dir} after placement")
    return "verified bitwise against a second read (no digest recorded)"
