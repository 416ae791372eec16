r"""Selective vs LTI vs attention on the synthetic probes: a CPU-sized grid (issue 41).

    python -m sptlib.experiments.selective --out=DIR [--jobs=2] [--steps=N] [--models=a,b] [--tasks=a,b]
        [--seeds=0,1,2] [--init=linen|torch] [--eval-every=N] [--task-options=JSON]

Grid: {mamba, mamba2, s4d, transformer} x {associative_recall (MQAR, 16 pairs, L = 128, key and
value vocabularies of 16: every key occurs once per sequence; chance 1/16), selective_copying
(16 tokens of a 16-token vocabulary among blanks, L = 256; chance 1/16)} x seeds {0, 1, 2} x
the lrs `LRS`. Every model is causal, 2 layers, d_model 64 (the Transformer: 4 heads, rotary
positions, FFN x 2; the SSMs: no FFN, their blocks as in their papers; S4D N = 64, Mamba N = 16,
Mamba-2 N = 64 with heads of 32), trained on freshly drawn sequences (batch 16, 1,000 steps,
AdamW, warmup 10% + cosine, clip 1, weight decay 0.1 except the "ssm" group). Seed 0 runs every
lr of `LRS`; the lr with the best accuracy on 500 validation sequences (a held-out stream of
their own) is chosen per (model, task), and seeds 1 and 2 run at it. Test: 1,000 further
held-out sequences, never used for a choice; accuracy over the answer positions
(`sptlib.data.probes`) and the fraction of sequences with every answer right. Results:
DIR/<model>_<task>_s<seed>_lr<lr>.json (a finished run is not repeated: the command resumes)
and DIR/table.md (test accuracy at the chosen lr, mean ± 95% t-interval over the seeds; the
chosen lr; each lr's validation accuracy; steps to learn per seed: the first logged step whose
training loss is below half of ln 16). `--eval-every` adds a validation curve to each record,
`--init` the dense projections' initialisation, `--task-options` a pilot probe (own --out).

The same probes also run through `sptlib.compare` (fixed training sets, SPT regimes included):
`get_config` here is experiments/probes.py's, so
`python -m sptlib.compare --config=experiments/selective.py:associative_recall --workdir=DIR`
runs that grid.

Budget, measured (2026-12-06, idle 2-core machine, `--jobs=2`): the whole grid (seed 0 at the
three lrs, seeds 1 and 2 at the chosen one: 40 runs; 44 ran, in two invocations, as 1e-2 was
added after the first) took 43 minutes of wall time; a run's
seconds (AR / SC): Mamba 157 / 312, Mamba-2 117 / 223, S4D 18 / 36, Transformer 28 / 77. The
table and what it shows: docs/reproducing.md, "Selective state spaces on the synthetic probes".
`--jobs` runs that many cells at once, one thread each.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time


MODELS = ("mamba", "mamba2", "s4d", "transformer")
# Key and value vocabularies of 16 (every key occurs in every sequence, chance 1/16): at 64 no
# model left chance within this CPU budget (pilots in docs/reproducing.md).
TASKS = {"associative_recall": dict(num_pairs=16, length=128, key_vocab=16, value_vocab=16),
         "selective_copying": dict(length=256, num_tokens=16, data_vocab=16)}
SEEDS = (0, 1, 2)
D_MODEL, N_LAYERS, BATCH, WD = 64, 2, 16, 0.1
INIT = "linen"  # dense projections (config.model.init_scheme); --init=torch: the reference code's
EVAL_EVERY = 0  # --eval-every: validation accuracy every that many steps (0: at the end only)
LRS = (1e-3, 3e-3, 1e-2)  # the lr axis: seed 0 runs each, validation picks one per (model, task)
LR_SEEDS = (0,)     # seeds that sweep LRS; the other seeds run at the lr they chose
NUM_VAL, NUM_TEST = 500, 1000
POSITIONAL = ("task", "model", "regime")  # of get_config (experiments/probes.py)


def get_config(arg="associative_recall"):
    """experiments/probes.py's `sptlib.compare` config for `arg` (task[,model,regime][,...])."""
    from sptlib.configs import common  # deferred: the worker processes never need it
    here = os.path.dirname(os.path.abspath(__file__))
    return common.load_module(os.path.join(here, "probes.py")).get_config(arg)


def model_cfg(model, info):
    """`config.model` for `model` on a probe with `info` (sptlib.data.probes.info); D_MODEL
    may be overridden by `--d-model` (pilots)."""
    from sptlib.models.config import model_config  # heavy (JAX): only in the run process
    m = model_config()
    m.d_model, m.n_layers, m.causal = D_MODEL, N_LAYERS, True
    m.init_scheme = INIT
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


def record_path(out, model, task, seed, lr):
    return os.path.join(out, f"{model}_{task}_s{seed}_lr{lr:g}.json")


def run_one(model, task, seed, lr, steps, out):
    """Trains one cell at peak lr `lr`; scores validation and test; writes its JSON record."""
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
    print(f"{model} {task} s{seed}: lr {lr} batch {BATCH} d_model {D_MODEL}", flush=True)
    model_def = build_model(model_cfg(model, info), {"kind": "token_logits",
                                                     "num_outputs": info["num_classes"]})
    t0 = time.time()
    data_seed = 1000 + seed  # training streams differ per seed; the test set is shared
    # Validation (chooses the lr) and test are disjoint held-out streams, shared by all seeds.
    val = probes.generate(task, NUM_VAL, seed=0, held_out=probes.VALIDATION_TAG, **opts)
    test = probes.generate(task, NUM_TEST, seed=0, held_out=True, **opts)
    first = probes.generate(task, BATCH, seed=data_seed, **opts)
    boxed = model_def.init(jax.random.PRNGKey(seed), jnp.asarray(first["inputs"]),
                           jnp.asarray(first["mask"]))["params"]
    labels = param_groups.param_labels(boxed)
    params = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x, boxed,
                          is_leaf=lambda x: hasattr(x, "unbox"))
    n_params = int(sum(x.size for x in jax.tree.leaves(params)))
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, steps // 10), steps)
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

    def evaluate(p, data=test):
        right, scored, exact = 0, 0, 0
        num = len(data["inputs"])
        for i in range(0, num, 250):
            b = {k: v[i:i + 250] for k, v in data.items()}
            pred = np.asarray(predict(p, b["inputs"], b["mask"]))
            w = b["targets"] >= 0
            ok = (pred == b["targets"]) & w
            right, scored = right + int(ok.sum()), scored + int(w.sum())
            exact += int((ok.sum(1) == w.sum(1)).sum())
        return right / scored, exact / num

    curve, losses, val_curve = [], [], []
    t_train = time.time()
    for step in range(steps):
        # Fresh sequences every step: stream ids step * BATCH + j of the seed's training stream.
        b = probes.GENERATORS[task][0](BATCH, seed=data_seed + 7919 * (step + 1), **opts)
        params, opt_state, loss = train_step(params, opt_state, b["inputs"], b["mask"],
                                             b["targets"])
        losses.append(float(loss)) if (step + 1) % 50 == 0 else None
        if step + 1 == steps // 2:
            curve.append((step + 1, evaluate(params)[0]))
        if EVAL_EVERY and (step + 1) % EVAL_EVERY == 0 and step + 1 < steps:
            val_curve.append((step + 1, evaluate(params, val)[0]))
    train_s = time.time() - t_train
    acc, exact = evaluate(params)
    val_acc, val_exact = evaluate(params, val)
    curve.append((steps, acc))
    val_curve.append((steps, val_acc))
    rec = {"model": model, "task": task, "seed": seed, "steps": steps, "batch": BATCH,
           "lr": lr, "d_model": D_MODEL, "init_scheme": INIT, "validation_accuracy": val_acc,
           "validation_curve": val_curve if EVAL_EVERY else [],
           "validation_exact": val_exact,
           "options": opts, "params": n_params, "test_accuracy": acc, "test_exact": exact,
           "curve": curve, "train_loss_every_50": losses, "train_seconds": train_s,
           "seconds": time.time() - t0}
    path = record_path(out, model, task, seed, lr)
    with open(path + ".tmp", "w") as f:
        json.dump(rec, f, indent=1)
    os.replace(path + ".tmp", path)
    print(f"{model} {task} s{seed} lr {lr:g}: val {val_acc:.3f} acc {acc:.3f} exact {exact:.3f} ({train_s:.0f} s train)",
          flush=True)


def _load(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def steps_to_learn(rec, chance_classes=16):
    """The first logged step (every 50) whose training loss at the answer positions is below
    half the chance loss ln(chance_classes): where a run leaves the plateau at chance (Mamba-1
    sits at ln 16 for ~1,450 steps on an easy recall probe before it learns). None: never."""
    threshold = 0.5 * math.log(chance_classes)
    for i, loss in enumerate(rec.get("train_loss_every_50", [])):
        if loss < threshold:
            return 50 * (i + 1)
    return None


def chosen_lr(out, model, task, lrs, lr_seeds):
    """The lr of `lrs` with the best mean validation accuracy over `lr_seeds` (ties: the first),
    or None while a sweep run is missing. Test accuracies never enter the choice."""
    best = None
    for lr in lrs:
        recs = [_load(record_path(out, model, task, s, lr)) for s in lr_seeds]
        if any(r is None for r in recs):
            return None
        score = sum(r["validation_accuracy"] for r in recs) / len(recs)
        if best is None or score > best[0]:
            best = (score, lr)
    return best[1]


def table(out, models, tasks, seeds, lrs, lr_seeds):
    """Markdown table: per (model, task) the test accuracy at the lr chosen on validation
    (mean ± 95% t-interval over the seeds, in %), the chosen lr and every lr's validation
    accuracy (mean over the sweep seeds)."""
    from sptlib.protocol import stats  # deferred: only the parent process writes the table
    lines = ["| model | task | test accuracy at answer positions (%) | all answers right (%) | "
             "lr chosen | validation accuracy per lr (%) | steps to learn | params | s/run |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m in models:
        for t in tasks:
            lr = chosen_lr(out, m, t, lrs, lr_seeds)
            per_lr = []
            for x in lrs:
                recs = [_load(record_path(out, m, t, s, x)) for s in lr_seeds]
                recs = [r for r in recs if r]
                val = (f"{100 * sum(r['validation_accuracy'] for r in recs) / len(recs):.1f}"
                       if recs else "–")
                per_lr.append(f"{x:g}: {val}")
            recs = [r for r in (_load(record_path(out, m, t, s, lr)) for s in seeds) if r] \
                if lr is not None else []
            acc = stats.mean_ci([r["test_accuracy"] for r in recs]).format(100)
            exact = stats.mean_ci([r["test_exact"] for r in recs]).format(100)
            secs = [r["seconds"] for r in recs]
            params = recs[0]["params"] if recs else "–"
            mean_s = f"{sum(secs) / len(secs):.0f}" if secs else "–"
            learn = ", ".join(str(steps_to_learn(r) or f">{r['steps']}") for r in recs) or "–"
            lines.append(f"| {m} | {t} | {acc} (n={len(recs)}) | {exact} | "
                         f"{'–' if lr is None else f'{lr:g}'} | {', '.join(per_lr)} | "
                         f"{learn} | {params} | {mean_s} |")
    return "\n".join(lines)


def main():
    global BATCH, D_MODEL, INIT, EVAL_EVERY  # the flags reach run_one and model_cfg
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (one thread each)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--lrs", default=",".join(f"{x:g}" for x in LRS),
                    help="peak learning rates; seeds in --lr-seeds run each")
    ap.add_argument("--lr-seeds", default=",".join(map(str, LR_SEEDS)),
                    help="seeds that sweep --lrs (the others run at the lr validation chose)")
    ap.add_argument("--batch", type=int, default=BATCH, help="sequences per step (pilots)")
    ap.add_argument("--d-model", type=int, default=D_MODEL, help="width (pilots)")
    ap.add_argument("--init", default=INIT, choices=("linen", "torch"),
                    help="dense projections' initialisation (config.model.init_scheme)")
    ap.add_argument("--eval-every", type=int, default=EVAL_EVERY,
                    help="validation accuracy every N steps into the record (0: end only)")
    ap.add_argument("--task-options", default="",
                    help='JSON overriding a task\'s options, e.g. \'{"num_pairs": 4, "length": 64}\' '
                         "(pilots; use another --out)")
    ap.add_argument("--run", default="", help=argparse.SUPPRESS)  # model,task,seed,lr (worker)
    a = ap.parse_args()
    BATCH, D_MODEL, INIT, EVAL_EVERY = a.batch, a.d_model, a.init, a.eval_every
    os.makedirs(a.out, exist_ok=True)
    for t in TASKS:
        TASKS[t] = dict(TASKS[t], **json.loads(a.task_options or "{}"))
    if a.run:
        m, t, s, lr = a.run.split(",")
        return run_one(m, t, int(s), float(lr), a.steps, a.out)
    models, tasks = a.models.split(","), a.tasks.split(",")
    seeds = [int(s) for s in a.seeds.split(",")]
    lrs = [float(x) for x in a.lrs.split(",")]
    lr_seeds = [s for s in (int(x) for x in a.lr_seeds.split(",")) if s in seeds] or seeds[:1]
    # Every (model, task, seed) cell; a sweep seed's cells at every lr, the others at the lr
    # chosen (None until the sweep of their (model, task) has finished).
    todo = [(m, t, s, lr) for s in lr_seeds for t in tasks for m in models for lr in lrs]
    todo += [(m, t, s, None) for s in seeds if s not in lr_seeds for t in tasks for m in models]
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    t0, running = time.time(), []
    while todo or running:
        while len(running) < max(1, a.jobs):
            ready = None
            for i, (m, t, s, lr) in enumerate(todo):
                lr = lr if lr is not None else chosen_lr(a.out, m, t, lrs, lr_seeds)
                if lr is not None:
                    ready = (i, (m, t, s, lr))
                    break
            if ready is None:
                break
            todo.pop(ready[0])
            m, t, s, lr = ready[1]
            if os.path.exists(record_path(a.out, m, t, s, lr)):
                continue  # finished earlier: resumable
            cmd = [sys.executable, "-m", "sptlib.experiments.selective", f"--out={a.out}",
                   f"--steps={a.steps}", f"--run={m},{t},{s},{lr:g}", f"--batch={BATCH}",
                   f"--d-model={D_MODEL}", f"--init={INIT}", f"--eval-every={EVAL_EVERY}",
                   f"--task-options={a.task_options}"]
            log = open(record_path(a.out, m, t, s, lr)[:-len(".json")] + ".log", "w")
            running.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=log), log,
                            (m, t, s, lr)))
        if not running and todo:
            sys.exit(f"no runnable cell: the lr sweep of {todo[0][:2]} failed (see its log)")
        time.sleep(2)
        for job in [j for j in running if j[0].poll() is not None]:
            running.remove(job)
            job[1].close()
            print(f"[{time.time() - t0:.0f} s] {job[2]} rc {job[0].returncode}", flush=True)
    md = table(a.out, models, tasks, seeds, lrs, lr_seeds)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    print(f"wall {time.time() - t0:.0f} s ({math.ceil((time.time() - t0) / 60)} min)")


if __name__ == "__main__":
    main()
