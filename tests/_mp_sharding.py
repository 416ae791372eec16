"""Helper of tests/test_sharding.py, run in a subprocess with JAX_NUM_CPU_DEVICES=8.

Trains the same model on the same global batch for 5 steps on one device and on the meshes
(data=4, tensor=2) and (fsdp=4, tensor=2); prints one JSON line with the losses and, per
parameter, its logical axis names, its mesh spec and its per-device shard shape.
"""

import json
import os
import sys

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402

import _mp_common as common  # noqa: E402
from sptlib import objectives  # noqa: E402
from sptlib.train import digest, optim, sharding, steps  # noqa: E402


def spec_list(spec):
    return [list(a) if isinstance(a, tuple) else a for a in spec]


def run(mesh_axes, devices):
    cfg = objectives.objective_config("masked")
    cfg.mask_rate = 0.3
    info = {"vocab_size": common.VOCAB, "num_classes": 3, "input_type": "tokens"}
    model_cfg = common.tiny_model_config(dropout=0.1)
    obj = objectives.make_objective(cfg, info, model_cfg)
    model, _ = common.build(obj.head_cfg, dropout=0.1)
    batch = common.token_batch(batch=8, seed=21)
    mesh_cfg = sharding.mesh_config()
    mesh_cfg.update(mesh_axes)
    mesh = sharding.create_mesh(mesh_cfg, devices)
    rules = sharding.default_rules()
    ocfg = optim.optim_config()
    ocfg.lr, ocfg.warmup_steps, ocfg.grad_clip = 3e-3, 2, 1.0
    abstract, logical = steps.state_logical_specs(model, obj, batch)
    tx = optim.make_optimizer(ocfg, abstract["params"], 5)
    state, shardings = steps.init_train_state(model, tx, batch, jax.random.PRNGKey(7), mesh,
                                              rules, objective=obj)
    train_step = steps.make_train_step(model, obj, tx, mesh, shardings, rules)
    eval_step = steps.make_eval_step(model, obj, mesh, shardings, rules)
    gb = sharding.shard_batch(batch, mesh, rules)
    losses = []
    for _ in range(5):
        state, metrics = train_step(state, gb)
        losses.append(float(metrics["loss"][0] / metrics["loss"][1]))
    ev = eval_step(state, gb)
    losses.append(float(ev["loss"][0] / ev["loss"][1]))
    params = {}
    flat_logical = {digest.leaf_path(p): s for p, s in
                    jax.tree_util.tree_flatten_with_path(
                        logical["params"], is_leaf=lambda x: isinstance(
                            x, jax.sharding.PartitionSpec) or x is None)[0]}
    for path, x in jax.tree_util.tree_flatten_with_path(state.params)[0]:
        name = digest.leaf_path(path)
        params[name] = {"logical": spec_list(flat_logical[name] or ()),
                        "spec": spec_list(x.sharding.spec), "shape": list(x.shape),
                        "shard": list(x.addressable_shards[0].data.shape)}
    # Adam moments live where their parameter lives.
    mu_specs = sorted({str(x.sharding.spec) for x in jax.tree.leaves(state.opt_state)
                       if x.ndim == 2})
    return {"losses": losses, "params": params, "mu_specs": mu_specs,
            "batch_spec": spec_list(gb["inputs"].sharding.spec),
            "fingerprint": steps.params_fingerprint(state.params)}


def main():
    assert jax.device_count() == 8, jax.device_count()
    out = {"one": run({"data": 1}, jax.devices()[:1]),
           "dp_tp": run({"data": 4, "fsdp": 1, "tensor": 2}, None),
           "fsdp_tp": run({"data": 1, "fsdp": 4, "tensor": 2}, None)}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
