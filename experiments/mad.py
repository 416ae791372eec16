r"""Does self-pretraining shrink the recall gap? The MAD tasks, MQAR and induction heads under the
protocol: scratch, equal-compute scratch and causal-LM SPT on the probe's own training sequences.

    python -m sptlib.compare --config=experiments/mad.py:mqar --workdir=DIR [--jobs=2]
    python -m sptlib.compare --config=experiments/mad.py:mad_in_context_recall,length=256 \
        --workdir=DIR
    python -m sptlib.compare --config=experiments/mad.py:mqar --workdir=DIR --report_only
    python -m sptlib.experiments.mad --workdir=DIR [--tasks=mad_in_context_recall,...]
        [--settings=baseline|all] [--jobs=2] [compare flags: --models=.. --seeds=.. ...]

The last runs the suite: one `sptlib.compare` grid per (task, setting) into
DIR/<task>/<setting>/ (settings: MAD's baseline, or `all`: each difficulty axis changed alone,
`mad.MAD_SETTINGS`), then DIR/mad_table.md: per task x setting x model x regime the test
accuracy (mean ± t-interval), the success rate (Wilson) and, per model x regime, MAD's score
(`mad.mad_score`: per task the mean accuracy over its settings, then the mean over tasks).

Tasks (`sptlib.data.mad`): mad_in_context_recall | mad_noisy_recall | mad_fuzzy_recall |
mad_selective_copying | mad_compression | mad_memorization (MAD's baseline settings,
`mad.MAD_SETTINGS`; any axis overridden by name: length, vocab_size, num_train, frac_noise,
num_tokens) | mqar (zoology's MQAR; CPU default here: L = 32, 4 pairs, 24 tokens (12 keys,
12 values: chance 1/12), power_a 0.01) | induction_heads (L 64, 16 tokens).

Grid: {transformer, mamba2, s4d, + any of gla, retnet, deltanet, gated_deltanet, mlstm, rwkv7,
hyena that `sptlib.layers.MIXERS` and `config.model` know} x {scratch (STEPS),
scratch-equal-compute (PRETRAIN_STEPS + STEPS), spt-causal (next-token prediction on the
NUM_TRAIN training sequences for PRETRAIN_STEPS, then STEPS of the `tagging` objective from its
best checkpoint)} x seeds {0, 1, 2}. Every model and stage is causal (the probes are causal
tasks, so masked SPT, a bidirectional objective, is not in the grid); 2 layers, d_model 64, the
Transformer 4 heads with rotary positions and FFN x 2, the SSMs no FFN (Mamba-2: heads of 32,
chunk 16); AdamW, peak lr LR (3e-3; the SSM parameters 1e-3 without weight decay, as the paper),
warmup + cosine, batch 16. Validation every EVAL_EVERY steps on NUM_EVAL
sequences (the steps-to-learn curve); test NUM_EVAL sequences of the held-out stream.

Reported (comparison.md, `sptlib.protocol.probereport`): besides the t-interval tables, per
cell the success rate (test accuracy >= `SUCCESS_THRESHOLD` %) with its Wilson interval, the
accuracy of the runs that learned, steps to learn (Kaplan-Meier median, runs that never learned
censored at their budget), Newcombe intervals of success-rate differences (SPT vs scratch, and
between models), accuracy at 2x, 4x, 8x the training length and per `LENGTH_SLICES` slice
(mqar: num_pairs 8 at each length, beside the trained 4; tasks whose length is fixed by their settings,
memorisation and compression, have none), and the fairness frontier (frontier.png): accuracy
against parameters, training FLOPs and recurrent state bytes (`state_bytes` of the records
when present), Pareto front marked.

Measured (2026-12-07/08, 2 CPU cores shared with ~8 other jobs, load average 19-30, `--jobs=2
--length_factors=2`): the MQAR grid did not fit in the session: 16 of its 27 runs finished in
~65 min of wall time (a run: 2-11 min; seed 0 of every cell, then three seeds of {transformer,
s4d} x {scratch, spt-causal}); tables in docs/reproducing.md, "MQAR and the MAD suite under the
protocol". The issue's grid (every MAD task x difficulty, ~2 h on an idle machine) was not run.

    get_config("task[,model,regime][,steps=..][,pretrain_steps=..][,length=..][,num_pairs=..]
                [,vocab_size=..][,num_train=..][,num_eval=..][,eval_every=..][,seeds=..]
                [,<any config.data.probes field>=..]")
"""

from sptlib.configs import common, cpu_sized
from sptlib.data import mad

POSITIONAL = ("task", "model", "regime")
BASE_MODELS = ("transformer", "mamba2", "s4d")
# Mixers being added in parallel; each joins the grid once `sptlib.layers.MIXERS` has it.
NEW_MIXERS = ("gla", "retnet", "deltanet", "gated_deltanet", "mlstm", "rwkv7", "hyena")
REGIMES = ("scratch", "scratch-equal-compute", "spt-causal")
STEPS = PRETRAIN_STEPS = 200
BATCH = 16
NUM_EVAL = 256
EVAL_EVERY = 50
LR = 3e-3
SUCCESS_THRESHOLD = 90.0
LENGTH_FACTORS = (2.0, 4.0, 8.0)  # where the task allows (not NO_LENGTH)
# Settings beside MAD's baselines (sptlib.data.mad.MAD_SETTINGS): the CPU-sized MQAR and
# induction heads.
OWN_SETTINGS = {"mqar": dict(length=32, num_pairs=4, vocab_size=24, power_a=0.01,
                             num_train=STEPS * BATCH),
                "induction_heads": dict(length=64, vocab_size=16, num_train=STEPS * BATCH)}
# Slices beside the trained num_pairs (each at 1x and every factor).
LENGTH_SLICES = {"mqar": ("num_pairs=8",)}
NO_LENGTH = ("mad_memorization", "mad_compression")
FIELDS_FLOAT = ("frac_noise", "power_a")


def available_models():
    """BASE_MODELS and the NEW_MIXERS that have landed (in MIXERS and in config.model)."""
    from sptlib.layers import MIXERS  # deferred: a config file stays cheap to import
    from sptlib.models.config import model_config  # deferred: as above
    m = model_config()
    return BASE_MODELS + tuple(n for n in NEW_MIXERS if n in MIXERS and n in m)


def _settings(task):
    if task in mad.MAD_SETTINGS:
        return dict(mad.MAD_SETTINGS[task][0])
    if task in OWN_SETTINGS:
        return dict(OWN_SETTINGS[task])
    raise ValueError(f"unknown probe task {task!r}; known: "
                     f"{sorted([*mad.MAD_SETTINGS, *OWN_SETTINGS])}")


def get_config(arg="mqar"):
    a = common.parse_arg(arg, POSITIONAL)
    task = a.pop("task", "mqar")
    settings = _settings(task)
    model = a.pop("model", "transformer")
    regime = a.pop("regime", "spt-causal")
    steps = int(a.pop("steps", STEPS))
    pretrain_steps = int(a.pop("pretrain_steps", PRETRAIN_STEPS))
    num_eval = int(a.pop("num_eval", NUM_EVAL))
    eval_every = int(a.pop("eval_every", EVAL_EVERY))
    seeds = tuple(int(s) for s in a.pop("seeds", "0:1:2").split(":"))
    lr = float(a.pop("lr", LR))
    for k in list(a):  # the rest: probe settings (config.data.probes fields, length)
        settings[k] = float(a.pop(k)) if k in FIELDS_FLOAT else int(a.pop(k))
    length = int(settings.pop("length"))
    num_train = int(settings.pop("num_train", steps * BATCH))
    options = {k: v for k, v in settings.items() if k in mad.OPTION_FIELDS.get(task, ())}
    unknown = sorted(set(settings) - set(options))
    if unknown:
        raise ValueError(f"{task}: settings {unknown} are not its fields; it reads "
                         f"{mad.OPTION_FIELDS[task]} and length, num_train")
    mixer = None
    if model in NEW_MIXERS:  # not a preset name: a Mamba-2 recipe with the mixer swapped
        mixer, model = model, "mamba2"
    c = cpu_sized.probe(
        model, regime, task=task, length=length, options=options, num_train=num_train,
        num_eval=num_eval, data_seed=0, n_layers=2, d_model=64, steps=steps,
        pretrain_steps=pretrain_steps, batch_size=BATCH, lr=lr, eval_every=eval_every,
        n_heads=4, ffn_mult=2 if model == "transformer" else 0, positions="rotary",
        compare=dict(models=available_models(), regimes=REGIMES, seeds=seeds,
                     length_factors=() if task in NO_LENGTH else LENGTH_FACTORS,
                     title=f"{task} (L={length}, "
                           + ", ".join(f"{k}={v}" for k, v in options.items())
                           + "): scratch vs causal SPT on the task's own sequences"))
    with c.unlocked():
        c.model.mamba2.head_dim, c.model.mamba2.chunk_size = 32, 16
        if mixer:
            c.model.mixer = mixer
        c.compare.length_slices = LENGTH_SLICES.get(task, ())
        c.compare.success_threshold = SUCCESS_THRESHOLD
    return c


def setting_name(setting, base):
    """'baseline' or the changed axes, 'length=256'."""
    changed = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
               for k, v in setting.items() if base.get(k) != v]
    return ",".join(changed) or "baseline"


def suite_table(workdir, tasks, threshold=SUCCESS_THRESHOLD):
    """mad_table.md's text from DIR/<task>/<setting>/comparison.json (whatever has finished)."""
    import json
    import os

    from sptlib.protocol import bimodal, stats  # deferred: only the suite's table needs them
    from sptlib.protocol.records import finished  # deferred: only the suite's table needs it

    lines = [f"# The MAD suite under the protocol ({workdir})", "",
             f"Test accuracy (%): mean ± 95% t-interval over seeds; success: runs at or above "
             f"{threshold:g}% with the 95% Wilson interval.", "",
             "| task | setting | model | regime | test accuracy | success |",
             "|---|---|---|---|---|---|"]
    per_cell = {}  # (model, regime) -> {task: [mean accuracy per setting]}
    for task in tasks:
        root = os.path.join(workdir, task)
        if not os.path.isdir(root):
            continue
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name, "comparison.json")
            if not os.path.exists(path):
                continue
            with open(path) as f:
                recs = finished(json.load(f))
            cells = {}
            for r in recs:
                cells.setdefault((r["model"], r["regime"]), []).append(r["test_accuracy"])
            for (m, g), accs in sorted(cells.items()):
                iv = stats.mean_ci(accs)
                k = sum(1 for a in accs if 100 * a >= threshold)
                lines.append(f"| {task} | {name} | {m} | {g} | {iv.format(100)} ({iv.n}) | "
                             f"{bimodal.wilson(k, len(accs)).format()} |")
                per_cell.setdefault((m, g), {}).setdefault(task, []).append(iv.mean)
    if per_cell:
        lines += ["", "MAD score (%): per task the mean accuracy over its settings run here, then "
                  "the mean over tasks (MAD picks each setting's best lr; here one lr).", "",
                  "| model | regime | tasks | MAD score | per task |", "|---|---|---|---|---|"]
        for (m, g), by_task in sorted(per_cell.items()):
            score, per = mad.mad_score(by_task)
            detail = ", ".join(f"{t} {100 * v:.1f}" for t, v in per.items())
            lines.append(f"| {m} | {g} | {len(per)} | {100 * score:.1f} | {detail} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    """The suite: a compare grid per (task, setting), then mad_table.md (module docstring)."""
    import argparse
    import os
    import subprocess
    import sys

    ap = argparse.ArgumentParser(description="The MAD suite under sptlib.compare.")
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--tasks", default=",".join(mad.MAD_TASKS))
    ap.add_argument("--settings", default="baseline", choices=("baseline", "all"))
    a, rest = ap.parse_known_args(argv)
    tasks = [t for t in a.tasks.split(",") if t]
    for t in tasks:
        _settings(t)  # an unknown task: one line before anything runs
    here = os.path.abspath(__file__)
    failed = []
    for task in tasks:
        base = _settings(task)
        settings = ([base] if a.settings == "baseline" or task not in mad.MAD_SETTINGS
                    else mad.mad_settings(task))
        for st in settings:
            name = setting_name(st, base)
            arg = ",".join([task] + [f"{k}={v}" for k, v in st.items() if base.get(k) != v])
            cmd = [sys.executable, "-m", "sptlib.compare", f"--config={here}:{arg}",
                   f"--workdir={os.path.join(a.workdir, task, name)}", *rest]
            print(" ".join(cmd), flush=True)
            if subprocess.call(cmd):
                failed.append(f"{task}/{name}")
    text = suite_table(a.workdir, tasks)
    os.makedirs(a.workdir, exist_ok=True)
    with open(os.path.join(a.workdir, "mad_table.md"), "w") as f:
        f.write(text)
    print(text)
    if failed:
        sys.exit(f"grids not finished: {', '.join(failed)}")


if __name__ == "__main__":
    main()
