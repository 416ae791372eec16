r"""Dump the randomness of an sptlib SPT → finetune run (2 × 64 Transformer, continuous inputs).

    python benchmarks/fidelity/dump_randomness.py --seed=1 --out=/tmp/rand_s1.npz \
        [--config=experiments/study.py:transformer,spt-masked]

Draws exactly what `sptlib.main` draws for that config and `--config.seed`: the parameters of
`build_stage` (pretraining, and the finetuning head that replaces the pretraining head), the
training batches in the data pipeline's order, and the masks of `MaskedDenoising` (train step
t masks with the first half of `split(fold_in(state.rng, t))`; validation masks from
`eval_key`). Writes `[steps, batch, length]` arrays: `pretrain.x` (float inputs), `.raw` (uint8
pixel targets), `.mask` (bool), `finetune.x`, `finetune.y`; `init.<torch name>` and
`fthead.weight/bias`; `val.x/raw/mask`, `val.y`, `test.x`, `test.y`.
"""

import argparse
import importlib.util

import jax
import jax.numpy as jnp
import numpy as np

from sptlib import data as data_lib
from sptlib.objectives.spt import span_mask
from sptlib.train import resolve, setup


def load_config(arg, seed):
    path, _, spec = arg.partition(":")
    mod_spec = importlib.util.spec_from_file_location("experiment", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    config = mod.get_config(spec)
    with config.unlocked():
        config.seed = seed
    return config


def torch_names(params, n_layers, d_model):
    """sptlib Transformer parameters -> `torch.nn.TransformerEncoder` state-dict names."""
    d = d_model
    backbone = params["backbone"]
    block = backbone["layers"]["layer"]["block"]
    attn = block["mixer"]
    out = {"enc.weight": params["encoder"]["dense"]["kernel"].T,
           "enc.bias": params["encoder"]["dense"]["bias"],
           "norm.weight": backbone["final_norm"]["layer_norm"]["scale"],
           "norm.bias": backbone["final_norm"]["layer_norm"]["bias"]}
    for i in range(n_layers):
        pre = f"body.layers.{i}."
        out[pre + "self_attn.in_proj_weight"] = np.concatenate(
            [np.asarray(attn[k][i]).reshape(d, d).T for k in ("query", "key", "value")])
        out[pre + "self_attn.in_proj_bias"] = np.concatenate(
            [np.asarray(attn[k + "_bias"][i]).reshape(d) for k in ("query", "key", "value")])
        out[pre + "self_attn.out_proj.weight"] = np.asarray(attn["out"][i]).reshape(d, d).T
        out[pre + "self_attn.out_proj.bias"] = attn["out_bias"][i]
        for torch_norm, norm in (("norm1", "mixer_norm"), ("norm2", "ffn_norm")):
            out[pre + torch_norm + ".weight"] = block[norm]["layer_norm"]["scale"][i]
            out[pre + torch_norm + ".bias"] = block[norm]["layer_norm"]["bias"][i]
        for torch_dense, dense in (("linear1", "wi"), ("linear2", "wo")):
            out[pre + torch_dense + ".weight"] = np.asarray(block["ffn"][dense]["kernel"][i]).T
            out[pre + torch_dense + ".bias"] = block["ffn"][dense]["bias"][i]
    (head,) = params["head"].values()
    out["head.weight"], out["head.bias"] = np.asarray(head["kernel"]).T, head["bias"]
    return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in out.items()}


def eval_split(task, built, split, objective=None):
    """Inputs, labels (and with `objective` the raw targets and scored masks) of a split."""
    xs, ys, raws, masks = [], [], [], []
    for b in task.make_iterator(split, batch_size=int(built.cfg.batch_size), seed=built.seed,
                                num_epochs=1, drop_remainder=False):
        keep = np.asarray(b.get("example_mask", np.ones(len(b["label"]), bool)), bool)
        xs.append(b["inputs"][keep, :, 0])
        ys.append(b["label"][keep])
        if objective is not None:
            real = jnp.asarray(b["mask"], bool)
            key = objective.eval_key({k: jnp.asarray(v) for k, v in b.items()})
            m = span_mask(key, real, objective.cfg.mask_rate, objective.cfg.span_length)
            masks.append(np.asarray(m)[keep])
            raws.append(b["raw"][keep, :, 0].astype(np.uint8))
    out = {"x": np.concatenate(xs).astype(np.float32), "y": np.concatenate(ys).astype(np.int64)}
    if objective is not None:
        out.update(raw=np.concatenate(raws), mask=np.concatenate(masks))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="experiments/study.py:transformer,spt-masked")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    config = load_config(a.config, a.seed)
    model = config.model
    if model.mixer != "attention" or "pretrain" not in config.stages:
        raise SystemExit(f"{a.config}: needs an attention model with a pretrain stage")
    task = data_lib.get_task(config.data)
    res = {}
    for name in ("pretrain", "finetune"):
        resolved = resolve.resolve_stage(config, name, info=task.info)
        it = task.make_iterator("train", batch_size=resolved.batch_size, seed=resolved.seed)
        built = setup.build_stage(config, name, example_batch=setup.peek(it), resolved=resolved)
        params = jax.tree.map(np.asarray, built.state.params)
        names = torch_names(params, int(model.n_layers), int(model.d_model))
        if name == "pretrain":
            res.update({"init." + k: v for k, v in names.items()})
            res.update({"val." + k: v for k, v in
                        eval_split(task, built, "validation", built.objective).items()})
            res.update({"test." + k: v for k, v in eval_split(task, built, "test").items()})
        else:
            res["fthead.weight"], res["fthead.bias"] = names["head.weight"], names["head.bias"]
        xs, raws, ys, masks = [], [], [], []
        for t in range(resolved.num_steps):
            b = next(it)
            if not (np.all(b["mask"]) and np.all(b.get("example_mask", True))):
                raise SystemExit("padded batches are not supported (fixed-length tasks only)")
            xs.append(b["inputs"][..., 0])
            raws.append(b["raw"][..., 0].astype(np.uint8))
            ys.append(b["label"])
            if name == "pretrain":
                key, _ = jax.random.split(jax.random.fold_in(built.state.rng, t))
                cfg = built.objective.cfg
                masks.append(np.asarray(span_mask(key, jnp.asarray(b["mask"], bool),
                                                  cfg.mask_rate, cfg.span_length)))
        res[name + ".x"] = np.stack(xs).astype(np.float32)
        res[name + ".raw"] = np.stack(raws)
        res[name + ".y"] = np.stack(ys).astype(np.int64)
        if masks:
            res[name + ".mask"] = np.stack(masks)
    np.savez(a.out, **res)
    print(f"wrote {a.out}: " + ", ".join(f"{k} {v.shape}" for k, v in sorted(res.items())
                                          if not k.startswith("init.")))


if __name__ == "__main__":
    main()
