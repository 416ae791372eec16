r"""A 1 GB Parquet file through `config.data.task = "files"`: peak memory and examples/s.

    python benchmarks/files_parquet.py --out /tmp/big.parquet [--gb 1.0] [--length 1024]

Writes (once) a Parquet file of random token sequences (`--length` int32 ids each, labels 0..9,
`--row_group` rows per row group, no compression or dictionary, so the file is ~`--gb` GB), then in one process:
infers the data spec (one streaming pass), and reads shuffled training batches and in-order
validation batches through the grain pipeline; prints seconds, examples/s and the process's peak
resident memory (ru_maxrss) after each phase. docs/your_data.md quotes its numbers.
"""

import argparse
import os
import resource
import time

import numpy as np


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write(path, gb, length, group):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = int(gb * 2 ** 30 / (4 * length))
    rng = np.random.default_rng(0)
    schema = pa.schema([("inputs", pa.list_(pa.int32())), ("label", pa.int64())])
    with pq.ParquetWriter(path, schema, compression="none", use_dictionary=False) as w:
        for s in range(0, rows, group):
            n = min(group, rows - s)
            ids = rng.integers(0, 30000, (n, length), dtype=np.int32)
            offsets = pa.array(np.arange(n + 1, dtype=np.int32) * length)
            col = pa.ListArray.from_arrays(offsets, pa.array(ids.reshape(-1)))
            w.write_table(pa.table({"inputs": col, "label": rng.integers(0, 10, n)}),
                          row_group_size=group)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--gb", type=float, default=1.0)
    p.add_argument("--length", type=int, default=1024)
    p.add_argument("--row_group", type=int, default=1024, help="rows per row group")
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--batch_size", type=int, default=32)
    a = p.parse_args()
    if not os.path.exists(a.out):
        t = time.time()
        write(a.out, a.gb, a.length, a.row_group)
        print(f"wrote {a.out}: {os.path.getsize(a.out) / 2 ** 30:.2f} GiB in "
              f"{time.time() - t:.0f} s")
    from sptlib.data import data_config, get_task
    c = data_config()
    c.task, c.files.train = "files", a.out
    c.read_threads, c.prefetch_buffer_size = 4, 8
    t = time.time()
    task = get_task(c)
    print(f"infer spec (one pass): {time.time() - t:.1f} s, peak RSS {peak_mb():.0f} MB; "
          f"rows {task.source('train').table.num_rows}, info {task.info}")
    for split, shuffle in (("train", "shuffled"), ("validation", "in order")):
        it = task.make_iterator(split, batch_size=a.batch_size, seed=0,
                                num_epochs=None if split == "train" else 1)
        next(it)
        t, n = time.time(), 0
        for _ in range(a.batches):
            try:
                n += len(next(it)["label"])
            except StopIteration:
                break
        dt = time.time() - t
        print(f"{split} ({shuffle}): {n} examples in {dt:.1f} s = {n / dt:.0f} examples/s, "
              f"peak RSS {peak_mb():.0f} MB")


if __name__ == "__main__":
    main()
