"""Generators of the LRA release layout (no download needed).

  python -m sptlib.data listops --out DIR --num_train N --num_val N --num_test N --seed S \
      [--min_length A --max_length B]
    -> DIR/listops-1000/basic_{train,val,test}.tsv
  python -m sptlib.data pathfinder --out DIR --resolution R --num N --seed S \
      [--contour_length 6|9|14]
    -> DIR/pathfinder{R}/curv_contour_length_{C}/{imgs,metadata}  (6 -> curv_baseline)
"""

import argparse
import sys
import tempfile
import time

from sptlib import errors
from sptlib.data import data_config, get_task, listops, pathfinder


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m sptlib.data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true",
                        help="print the traceback of errors (also: SPTLIB_TRACEBACK=1)")

    lo = sub.add_parser("listops", parents=[common], help="generate ListOps (LRA algorithm)")
    lo.add_argument("--out", required=True, help="folder to hold listops-1000/")
    lo.add_argument("--num_train", type=int, default=96000)
    lo.add_argument("--num_val", type=int, default=2000)
    lo.add_argument("--num_test", type=int, default=2000)
    lo.add_argument("--seed", type=int, default=0)
    lo.add_argument("--min_length", type=int, default=500, help="exclusive lower length bound")
    lo.add_argument("--max_length", type=int, default=2000, help="exclusive upper length bound")
    lo.add_argument("--no_progress", action="store_true")

    pf = sub.add_parser("pathfinder", parents=[common],
                        help="generate Pathfinder images (release format)")
    pf.add_argument("--out", required=True, help="folder to hold pathfinder{R}/")
    pf.add_argument("--resolution", type=int, default=32)
    pf.add_argument("--num", type=int, default=2000, help="number of images (all splits)")
    pf.add_argument("--seed", type=int, default=0)
    pf.add_argument("--contour_length", type=int, default=14, choices=(6, 9, 14))
    pf.add_argument("--images_per_folder", type=int, default=1000)
    pf.add_argument("--no_progress", action="store_true")

    tp = sub.add_parser("throughput", parents=[common],
                        help="measure pipeline examples/s on generated data")
    tp.add_argument("--task", default="listops", choices=("listops", "pathfinder"))
    tp.add_argument("--lra_dir", default="", help="existing/generated data (default: a temp dir)")
    tp.add_argument("--batch_size", type=int, default=64)
    tp.add_argument("--seconds", type=float, default=5.0)

    args = p.parse_args(argv)
    try:
        return _run(args)
    except errors.SptlibError as e:
        return errors.report(e, "python -m sptlib.data", verbose=args.verbose or None)


def _run(args):
    if args.command == "throughput":
        return _throughput(args)
    t0 = time.time()
    if args.command == "listops":
        folder = listops.generate_release(
            args.out, num_train=args.num_train, num_val=args.num_val, num_test=args.num_test,
            seed=args.seed, min_length=args.min_length, max_length=args.max_length,
            progress=not args.no_progress)
    else:
        folder = pathfinder.generate_release(
            args.out, resolution=args.resolution, num=args.num, seed=args.seed,
            contour_length=args.contour_length, images_per_folder=args.images_per_folder,
            progress=not args.no_progress)
    print(f"wrote {folder} in {time.time() - t0:.1f}s")
    return 0


def _throughput(args):
    cfg = data_config()
    cfg.task = args.task
    cfg.lra_dir = args.lra_dir or tempfile.mkdtemp()
    cfg.generate.update(enabled=True, num_train=2000, num_val=10, num_test=10)
    task = get_task(cfg)
    it = task.make_iterator("train", batch_size=args.batch_size, seed=0)
    next(it)
    n, t0 = 0, time.time()
    while time.time() - t0 < args.seconds:
        next(it)
        n += args.batch_size
    print(f"{args.task}: {n / (time.time() - t0):.0f} examples/s "
          f"(batch {args.batch_size}, length {task.info['max_length']}, "
          f"{cfg.read_threads} read threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
