"""Input-pipeline throughput against what the train step consumes.

For ListOps and Pathfinder: `sptlib.data.get_task(config.data).make_iterator("train", ...)` with
the experiment config's own data settings (threads, prefetch, workers), on a small generated
release cached under `--data-dir` (generated once: ListOps by `sptlib.data.listops`, Pathfinder
by `sptlib.data.pathfinder`; nothing is downloaded). Examples/s is measured after the first batch
(pipeline start-up is reported apart), and compared with the examples/s of the task's train step
(the fastest model measured on that task in this run: the strictest consumer).
"""

import os
import time

import ml_collections

from sptlib.bench import common
from sptlib.bench.train_step import load_config
from sptlib.data import get_task, listops, pathfinder

PIPELINE_TARGET = 10.0  # pipeline examples/s >= 10x what the train step consumes

TASKS = {
    # task: (experiment config whose data settings are used, consumers measured if missing)
    "listops": ("lra.py:listops,s4,spt-masked",
                ("lra.py:listops,s4,spt-masked", "lra.py:listops,transformer,spt-masked")),
    "pathfinder": ("lra.py:pathfinder,s4,spt-masked",
                   ("lra.py:pathfinder,s4,spt-masked",
                    "lra.py:pathfinder,transformer,spt-masked")),
}


def prepare_data(task, data_dir, num_train):
    """Generates the task's files under `data_dir` unless they are there (returns data_dir)."""
    os.makedirs(data_dir, exist_ok=True)
    if task == "listops":
        if not os.path.exists(listops.split_path(data_dir, "train")):
            listops.generate_release(data_dir, num_train=num_train, num_val=16, num_test=16,
                                     seed=0, min_length=500, max_length=2000)
    elif task == "pathfinder":
        folder = pathfinder.folder_path(data_dir, 32, "curv_contour_length_14")
        if not os.path.isdir(os.path.join(folder, "metadata")):
            # 80/10/10 split like the release: train gets 80%.
            pathfinder.generate_release(data_dir, resolution=32, num=int(num_train / 0.8) + 1,
                                        seed=0, contour_length=14)
    return data_dir


def bench_task(task, data_dir, *, batch_size=None, num_batches=100, num_train=512,
               max_seconds=30.0):
    """Examples/s of the task's train iterator (record without the consumer comparison)."""
    spec, _ = TASKS[task]
    config = load_config(spec)
    data = ml_collections.ConfigDict(config.data.to_dict())
    data.lra_dir = prepare_data(task, data_dir, num_train)
    data.generate.enabled = False
    bs = batch_size or int(config.stages[config.stage_order[0]].batch_size)
    t_start = time.perf_counter()
    task_obj = get_task(data)
    it = task_obj.make_iterator("train", batch_size=bs, seed=0)
    next(it)
    startup = time.perf_counter() - t_start
    n, t0 = 0, time.perf_counter()
    while n < num_batches:
        next(it)
        n += 1
        if time.perf_counter() - t0 > max_seconds and n >= 3:
            break
    sec = (time.perf_counter() - t0) / n
    length = int(task_obj.info["max_length"])
    return {"name": f"pipeline/{task}", "kind": "pipeline", "length": length,
            "batch": bs, "seconds": sec, "examples_per_s": bs / sec,
            "tokens_per_s": bs * length / sec, "startup_s": startup,
            "batches": n, "config": spec, "input_type": data.input_type,
            "read_threads": int(data.read_threads), "num_workers": int(data.num_workers),
            "prefetch_buffer_size": int(data.prefetch_buffer_size)}


def run(tasks, data_dir, *, train_records=(), measure_consumer=None, emit=common.emit,
        num_batches=100, num_train=512):
    """One record per task; `measure_consumer(spec)` gives a train record when this run has none
    for the task."""
    out = []
    for task in tasks:
        try:
            rec = bench_task(task, data_dir, num_batches=num_batches, num_train=num_train)
            consumers = [r for r in train_records if r.get("kind") == "train_step"
                         and f":{task}," in r["name"]]
            if not consumers and measure_consumer is not None:
                consumers = [measure_consumer(s) for s in TASKS[task][1]]
                consumers = [c for c in consumers if c and c.get("kind") == "train_step"]
            if consumers:
                fastest = max(consumers, key=lambda r: r["examples_per_s"])
                rec.update(model_examples_per_s=fastest["examples_per_s"],
                           model=fastest["name"], model_length=fastest["length"])
                ratio = rec["examples_per_s"] / fastest["examples_per_s"]
                rec["ratio_to_model"] = round(ratio, 2)
                common.with_target(rec, ratio, PIPELINE_TARGET, ">=")
                rec["target_of"] = "ratio_to_model"
        except Exception as e:  # noqa: BLE001
            rec = {"name": f"pipeline/{task}", "kind": "error",
                   "error": f"{type(e).__name__}: {str(e)[:300]}"}
        out.append(emit(rec))
    return out
