r"""Selective vs LTI vs attention on the synthetic probes: a CPU-sized grid (issue 41).

    python experiments/selective.py --out=DIR [--jobs=2] [--steps=N] [--models=a,b] [--tasks=a,b]
        [--seeds=0,1,2]

Grid: {mamba, mamba2, s4d, transformer} x {associative_recall (MQAR, 16 pairs, L = 128, key and
value vocabularies of 64), selective_copying (16 tokens of a 16-token vocabulary among blanks,
L = 256)} x seeds {0, 1, 2}. Every model is causal, 2 layers, d_model 64 (the Transformer: 4
heads, rotary positions, FFN x 2; the SSMs: no FFN, their blocks as in their papers; S4D N = 64,
Mamba N = 16, Mamba-2 N = 64 with heads of 32), trained on freshly drawn sequences (batch 16,
1,000 steps, AdamW lr 1e-3, warmup 10% + cosine, clip 1, weight decay 0.1 except the "ssm"
group) and scored on 1,000 held-out sequences: accuracy over the answer positions (`sptlib.data.probes`), and the fraction
of sequences with every answer right. Results: DIR/<model>_<task>_s<seed>.json (a finished run
is not repeated) and DIR/table.md (means with 95% t-intervals over the seeds).

The same probes also run through `sptlib.compare` (fixed training sets, SPT regimes included):
`get_config` here is experiments/probes.py's, so
`python -m sptlib.compare --config=experiments/selective.py:associative_recall --workdir=DIR`
runs that grid.

Budget: CPU seconds per training step measured here (batch 16, one thread, associative recall):
Mamba 0.34, Mamba-2 0.19, Transformer 0.04; selective copying (L = 256) about twice that. The
whole grid, 24 runs of 1,000 steps, is then ~6,400 CPU seconds with compilation and evaluation:
~55 minutes on 2 free cores -- an estimate from those per-step costs; the grid was not run on
free cores (docs/reproducing.md, "Selective state spaces on the synthetic probes", has what was
measured, the command and its wall time). `--jobs` runs that many cells at once, one thread each.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODELS = ("mamba", "mamba2", "s4d", "transformer")
TASKS = {"associative_recall": dict(num_pairs=16, length=128, key_vocab=64, value_vocab=64),
         "selective_copying": dict(length=256, num_tokens=16, data_vocab=16)}
SEEDS = (0, 1, 2)
D_MODEL, N_LAYERS, BATCH, LR, WD = 64, 2, 16, 1e-3, 0.1
NUM_TEST = 1000
POSITIONAL = ("task", "model", "regime")  # of get_config (experiments/probes.py)


def get_config(arg="associative_recall"):
    """experiments/probes.py's `sptlib.compare` config for `arg` (task[,model,regime][,...])."""
    sys.path.insert(0, ROOT)
    from sptlib.configs import common  # after sys.path has the repository root (script run)
    return common.load_module(os.path.join(ROOT, "experiments", "probes.py")).get_config(arg)


def model_cfg(model, info):
    """`config.model` for `model` on a probe with `info` (sptlib.data.probes.info); D_MODEL
    may be overridden by `--d-model` (pilots)."""
    from sptlib.models.config import model_config  # heavy (JAX): only in the run process
    m = model_config()
    m.d_model, m.n_layers, m.causal = D_MODEL, N_LAYERS, True
    m.vocab_size, m.max_length = info["vocab_size"], info["max_length"]
    m.scan_layers = False
    if model == "transformer":
        m.mixer, m.ffn_mult = "attention", 2
        m.attention.n_heads, m.attention.positions = 4, "rotary"
    else:
        m.mixer, m.ffn_mult = model, 0
        if model == "mamba2":
            m.mamba2.head_dim = 32
            m.mamba2.chunk_size = 16  # fwd+bwd 0.14 CPU s/step at 16 vs 0.18 at 64 (measured)
        if model == "mamba":
            # CPU s per fwd+bwd step (batch 16, L 128, one thread, measured): chunk 2 0.19,
            # 4 0.21, 8 0.29, 16 0.36, 128 0.85
            m.mamba.chunk_size = 2
    return m


def run_one(model, task, seed, steps, out):
    """Trains and evaluates one cell; writes its JSON record."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    # JAX and the model stack load in the run process only (the scheduler stays light)
    from sptlib.data import probes  # (see above)
    from sptlib.layers import param_groups  # (see above)
    from sptlib.models import build_model  # (see above)

    opts = TASKS[task]
    info = probes.info(task, **opts)
    print(f"{model} {task} s{seed}: lr {LR} batch {BATCH} d_model {D_MODEL}", flush=True)
    model_def = build_model(model_cfg(model, info), {"kind": "token_logits",
                                                     "num_outputs": info["num_classes"]})
    t0 = time.time()
    data_seed = 1000 + seed  # training streams differ per seed; the test set is shared
    test = probes.generate(task, NUM_TEST, seed=0, held_out=True, **opts)
    first = probes.generate(task, BATCH, seed=data_seed, **opts)
    boxed = model_def.init(jax.random.PRNGKey(seed), jnp.asarray(first["inputs"]),
                           jnp.asarray(first["mask"]))["params"]
    labels = param_groups.param_labels(boxed)
    params = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x, boxed,
                          is_leaf=lambda x: hasattr(x, "unbox"))
    n_params = int(sum(x.size for x in jax.tree.leaves(params)))
    sched = optax.warmup_cosine_decay_schedule(0.0, LR, max(1, steps // 10), steps)
    groups = {g: optax.adamw(sched, weight_decay=WD if g == "default" else 0.0)
              for g in set(jax.tree.leaves(labels))}
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.multi_transform(groups, labels))
    opt_state = tx.init(params)

    def loss_fn(p, inputs, mask, targets):
        logits = model_def.apply({"params": p}, inputs, mask).astype(jnp.float32)
        w = (targets >= 0).astype(jnp.float32)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.maximum(targets, 0))
        return jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1.0)

    @jax.jit
    def train_step(p, o, inputs, mask, targets):
        loss, g = jax.value_and_grad(loss_fn)(p, inputs, mask, targets)
        upd, o = tx.update(g, o, p)
        return optax.apply_updates(p, upd), o, loss

    @jax.jit
    def predict(p, inputs, mask):
        return jnp.argmax(model_def.apply({"params": p}, inputs, mask), axis=-1)

    def evaluate(p):
        right, scored, exact = 0, 0, 0
        for i in range(0, NUM_TEST, 250):
            b = {k: v[i:i + 250] for k, v in test.items()}
            pred = np.asarray(predict(p, b["inputs"], b["mask"]))
            w = b["targets"] >= 0
            ok = (pred == b["targets"]) & w
            right, scored = right + int(ok.sum()), scored + int(w.sum())
            exact += int((ok.sum(1) == w.sum(1)).sum())
        return right / scored, exact / NUM_TEST

    curve, losses = [], []
    t_train = time.time()
    for step in range(steps):
        # Fresh sequences every step: stream ids step * BATCH + j of the seed's training stream.
        b = probes.GENERATORS[task][0](BATCH, seed=data_seed + 7919 * (step + 1), **opts)
        params, opt_state, loss = train_step(params, opt_state, b["inputs"], b["mask"],
                                             b["targets"])
        losses.append(float(loss)) if (step + 1) % 50 == 0 else None
        if step + 1 == steps // 2:
            curve.append((step + 1, evaluate(params)[0]))
    train_s = time.time() - t_train
    acc, exact = evaluate(params)
    curve.append((steps, acc))
    rec = {"model": model, "task": task, "seed": seed, "steps": steps, "batch": BATCH,
           "lr": LR, "d_model": D_MODEL,
           "options": opts, "params": n_params, "test_accuracy": acc, "test_exact": exact,
           "curve": curve, "train_loss_every_50": losses, "train_seconds": train_s,
           "seconds": time.time() - t0}
    path = os.path.join(out, f"{model}_{task}_s{seed}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f, indent=1)
    os.replace(path + ".tmp", path)
    print(f"{model} {task} s{seed}: acc {acc:.3f} exact {exact:.3f} ({train_s:.0f} s train)",
          flush=True)


def table(out, models, tasks, seeds):
    """Markdown table of the finished runs (mean ± 95% t-interval over seeds, in %)."""
    sys.path.insert(0, ROOT)
    from sptlib.protocol import stats  # after sys.path has the repository root (script run)
    lines = ["| model | " + " | ".join(f"{t} acc (%)" for t in tasks) + " | "
             + " | ".join(f"{t} exact (%)" for t in tasks) + " | params | s/run |",
             "|---" * (2 + 2 * len(tasks)) + "|---|"]
    for m in models:
        accs, exacts, secs, params = {}, {}, [], ""
        for t in tasks:
            recs = []
            for s in seeds:
                p = os.path.join(out, f"{m}_{t}_s{s}.json")
                if os.path.exists(p):
                    with open(p) as f:
                        recs.append(json.load(f))
            accs[t] = stats.mean_ci([r["test_accuracy"] for r in recs]).format(100)
            accs[t] += f" (n={len(recs)})"
            exacts[t] = stats.mean_ci([r["test_exact"] for r in recs]).format(100)
            secs += [r["seconds"] for r in recs]
            params = params or (recs and str(recs[0]["params"])) or ""
        mean_s = f"{sum(secs) / len(secs):.0f}" if secs else "–"
        lines.append(f"| {m} | " + " | ".join(accs[t] for t in tasks) + " | "
                     + " | ".join(exacts[t] for t in tasks) + f" | {params} | {mean_s} |")
    return "\n".join(lines)


def main():
    global LR, BATCH, D_MODEL  # --lr / --batch / --d-model reach run_one and model_cfg
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (one thread each)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--lr", type=float, default=LR, help="peak lr (pilots)")
    ap.add_argument("--batch", type=int, default=BATCH, help="sequences per step (pilots)")
    ap.add_argument("--d-model", type=int, default=D_MODEL, help="width (pilots)")
    ap.add_argument("--run", default="", help=argparse.SUPPRESS)  # model,task,seed (worker)
    a = ap.parse_args()
    LR, BATCH, D_MODEL = a.lr, a.batch, a.d_model
    os.makedirs(a.out, exist_ok=True)
    if a.run:
        m, t, s = a.run.split(",")
        sys.path.insert(0, ROOT)
        return run_one(m, t, int(s), a.steps, a.out)
    models, tasks = a.models.split(","), a.tasks.split(",")
    seeds = [int(s) for s in a.seeds.split(",")]
    todo = [(m, t, s) for s in seeds for t in tasks for m in models
            if not os.path.exists(os.path.join(a.out, f"{m}_{t}_s{s}.json"))]
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    t0, running = time.time(), []
    while todo or running:
        while todo and len(running) < max(1, a.jobs):
            m, t, s = todo.pop(0)
            cmd = [sys.executable, os.path.abspath(__file__), f"--out={a.out}",
                   f"--steps={a.steps}", f"--run={m},{t},{s}", f"--lr={LR}",
                   f"--batch={BATCH}", f"--d-model={D_MODEL}"]
            log = open(os.path.join(a.out, f"{m}_{t}_s{s}.log"), "w")
            running.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=log), log,
                            (m, t, s)))
        time.sleep(2)
        for job in [j for j in running if j[0].poll() is not None]:
            running.remove(job)
            job[1].close()
            print(f"[{time.time() - t0:.0f} s] {job[2]} rc {job[0].returncode}", flush=True)
    md = table(a.out, models, tasks, seeds)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    print(f"wall {time.time() - t0:.0f} s ({math.ceil((time.time() - t0) / 60)} min)")


if __name__ == "__main__":
    main()
