"""Helper of tests/test_multiprocess.py: one training process.

    python _mp_worker.py OUT.json single                 # 1 process, 2 CPU devices
    python _mp_worker.py OUT.json dist PORT PROCESS_ID   # 1 of 2 processes, 1 CPU device each

Both train the same model on the same global batch (8 examples) for 5 steps on a mesh
(fsdp=2): the single process feeds the whole batch, each distributed process its half through
`shard_batch`. Writes the losses and `params_fingerprint` as JSON.
"""

import json
import os
import sys

MODE = sys.argv[2]
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_NUM_CPU_DEVICES"] = "2" if MODE == "single" else "1"
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402

from sptlib.train import sharding  # noqa: E402


def main():
    out_path = sys.argv[1]
    mesh_cfg = sharding.mesh_config()
    mesh_cfg.data, mesh_cfg.fsdp = 1, 2
    if MODE == "dist":
        mesh_cfg.coordinator_address = f"127.0.0.1:{sys.argv[3]}"
        mesh_cfg.num_processes, mesh_cfg.process_id = 2, int(sys.argv[4])
        mesh_cfg.initialization_timeout = 60
    sharding.maybe_initialize_distributed(mesh_cfg)

    import _mp_common as common  # pylint: disable=import-outside-toplevel
    from sptlib import objectives  # pylint: disable=import-outside-toplevel
    from sptlib.train import optim, steps  # pylint: disable=import-outside-toplevel

    assert jax.device_count() == 2, jax.device_count()
    cfg = objectives.objective_config("masked")
    cfg.mask_rate = 0.3
    info = {"vocab_size": common.VOCAB, "num_classes": 3, "input_type": "tokens"}
    model_cfg = common.tiny_model_config(dropout=0.1)
    obj = objectives.make_objective(cfg, info, model_cfg)
    model, _ = common.build(obj.head_cfg, dropout=0.1)
    batch = common.token_batch(batch=8, seed=31)
    n, i = jax.process_count(), jax.process_index()
    local = {k: v[i * 8 // n:(i + 1) * 8 // n] for k, v in batch.items()}
    mesh = sharding.create_mesh(mesh_cfg)
    rules = sharding.default_rules()
    ocfg = optim.optim_config()
    ocfg.lr = 3e-3
    abstract, _ = steps.state_logical_specs(model, obj, local)
    tx = optim.make_optimizer(ocfg, abstract["params"], 5)
    state, shardings = steps.init_train_state(model, tx, local, jax.random.PRNGKey(3), mesh,
                                              rules, objective=obj)
    train_step = steps.make_train_step(model, obj, tx, mesh, shardings, rules)
    gb = sharding.shard_batch(local, mesh, rules)
    assert gb["inputs"].shape == batch["inputs"].shape
    losses = []
    for _ in range(5):
        state, metrics = train_step(state, gb)
        losses.append(float(metrics["loss"][0] / metrics["loss"][1]))
    result = {"losses": losses, "fingerprint": steps.params_fingerprint(state.params),
              "process_index": i, "process_count": n, "main": sharding.is_main_process(),
              "sharded": any(not x.is_fully_addressable for x in jax.tree.leaves(state.params))}
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f)
    if MODE == "dist":
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()
