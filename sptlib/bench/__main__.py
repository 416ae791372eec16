"""Command line of the benchmark suite.

    python -m sptlib.bench [--quick] [--only mixers,train,pipeline,matmul] [--lengths 1024,4096]
        [--mixers s4d,attention_chunked] [--memory analysis|rss] [--markdown docs/benchmarks.md]
        [--peer torch]

`--accelerator-report [--tiny]` measures nothing else: the accelerator report of
`sptlib.bench.accel` (Text Transformer step vs PyTorch at batch 8 / 32 in fp32 / bf16, attention
kernels, S4D vs PyTorch, the PathX, ListOps and GSS LM steps; TFLOP/s and peak memory per row),
sized for one GPU in under 8 minutes; `--tiny` runs it at toy sizes (seconds on a CPU).

`--peer torch` adds the side-by-side section (S4D, S4 DPLR, the quickstart Transformer's train
step against PyTorch reference blocks in benchmarks/peers/, timed interleaved in this process);
it needs PyTorch (optional, CPU build: `pip install torch==2.13.0`).

One JSON record per measurement on stdout (fields in `sptlib.bench.common`); progress and
warnings on stderr. `--quick` (few lengths, small sizes) takes a few minutes on 2 CPU cores.
"""

import argparse
import os
import shlex
import sys
import tempfile
import time

if __name__ == "__main__" and {"--accelerator-report", "--peer"} & set(sys.argv):
    # Before JAX starts: grow GPU memory on demand and leave PyTorch (same process) a share.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")

SECTIONS = ("mixers", "train", "pipeline", "matmul", "peer")  # peer: only with --peer


def _ints(s):
    return tuple(int(x) for x in s.split(",") if x.strip())


def _names(s):
    return tuple(x.strip() for x in s.split(",") if x.strip())


def _configs(s):
    # ';'-separated: config arguments contain commas themselves.
    return tuple(x.strip() for x in s.split(";") if x.strip())


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m sptlib.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="few lengths, small sizes: a few minutes on 2 CPU cores")
    p.add_argument("--only", type=_names, default=SECTIONS,
                   help=f"comma-separated sections of {SECTIONS} (train includes matmul)")
    p.add_argument("--lengths", type=_ints, default=None,
                   help="mixer lengths (default 1024,2048,4096,8192,16384; quick 1024,4096: "
                        "two, so the scaling exponent is measured)")
    p.add_argument("--baseline-lengths", type=_ints, default=None,
                   help="lengths of the kernel baselines (default the mixer lengths; quick "
                        "256,1024)")
    p.add_argument("--mixers", type=_names, default=None, help="mixer names (default all)")
    p.add_argument("--kinds", type=_names, default=("forward", "forward_backward"))
    p.add_argument("--scaling-passes", type=int, default=None,
                   help="passes over all lengths behind each SSM scaling exponent (default 3, "
                        "quick 2; 0: the exponent of the sweep's single timing per length)")
    p.add_argument("--no-baselines", action="store_true",
                   help="skip fft-vs-direct convolution and parallel-vs-sequential scan")
    p.add_argument("--memory", choices=("analysis", "rss"), default="analysis",
                   help="peak memory from XLA's memory analysis of the compiled executable "
                        "(deterministic, default) or max RSS of a fresh subprocess per "
                        "measurement minus an idle JAX process")
    p.add_argument("--memory-cap-gb", type=float, default=8.0,
                   help="skip a measurement whose planned peak exceeds this (GiB)")
    p.add_argument("--repeats", type=int, default=None, help="timed calls (median; default 5, "
                                                             "quick 3)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="stop repeating once the timed calls took this long (default 15, "
                        "quick 2)")
    p.add_argument("--direct-max-length", type=int, default=None,
                   help="longest direct (O(L^2)) convolution baseline (default 1024, quick 256)")
    p.add_argument("--train-configs", type=_configs, default=None,
                   help="experiment configs relative to experiments/, separated by ';' "
                        "(file.py[:arg], e.g. 'lra.py:text,s4,scratch;smoke.py')")
    p.add_argument("--train-max-tokens", type=int, default=None,
                   help="tokens per train step (batch reduced to fit; default 2048, quick 512)")
    p.add_argument("--train-max-length", type=int, default=None,
                   help="cap the train length (default: real length; quick 256)")
    p.add_argument("--pipelines", type=_names, default=("listops", "pathfinder"))
    p.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "sptlib_bench_data"),
                   help="generated ListOps/Pathfinder files for the pipeline benchmark (cached)")
    p.add_argument("--markdown", default=None, help="render the tables into this file")
    p.add_argument("--section", default=None,
                   help="name of the generated section in the markdown file (default full or "
                        "quick)")
    p.add_argument("--train-records", default=None, metavar="JSONL",
                   help="pipeline section: compare against the train_step records saved in "
                        "JSONL (a previous --only train run) instead of measuring consumers")
    p.add_argument("--render", default=None, metavar="JSONL",
                   help="measure nothing: render the records saved in JSONL (a previous run's "
                        "stdout) into --markdown, headed by --render-command")
    p.add_argument("--render-command", default="(not recorded)",
                   help="the command that produced --render's records")
    p.add_argument("--peer", choices=None, default=None, metavar="LIB",
                   help="also time the reference blocks of LIB (torch) side by side: S4D, "
                        "S4 DPLR, the quickstart Transformer train step; needs LIB installed")
    p.add_argument("--peer-lengths", type=_ints, default=None,
                   help="SSM lengths of the peer rows (default 1024,4096,16384; quick "
                        "1024,4096)")
    p.add_argument("--accelerator-report", action="store_true",
                   help="run only the accelerator report (sptlib.bench.accel) and print its "
                        "tables; with --markdown, into its `accelerator` section")
    p.add_argument("--tiny", action="store_true",
                   help="--accelerator-report at toy sizes (a CPU smoke test, seconds)")
    p.add_argument("--report-budget-s", type=float, default=390.0,
                   help="--accelerator-report: rows not started within this many seconds are "
                        "skipped (default 390, so that the report ends in under 8 minutes)")
    p.add_argument("--report-sections", type=_names, default=None,
                   help="--accelerator-report sections (default all: text, attention, s4d, "
                        "steps; sptlib.bench.accel.SECTIONS)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)

    def one_line_error(message):  # bad input: one line, exit 2 (argparse prints its usage)
        p.exit(2, f"{p.prog}: error: {message}; see --help\n")

    p.error = one_line_error
    return p.parse_args(argv)


if __name__ == "__main__":
    parse_args(sys.argv[1:])  # --help and bad flags answer here, before JAX is imported
    # Then, on CPU hosts, the process is re-executed (platform kernels).
    from sptlib.kernels import platform
    platform.prepare_process()

from sptlib.bench import accel, accel_tables, baselines, common, markdown, mixers, peers, pipeline, train_step  # noqa: E402


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.child is not None:
        mixers.main_child(args.child)
        return 0
    bad = [s for s in args.only if s not in SECTIONS]
    if bad:
        raise SystemExit(f"--only: unknown sections {bad}; known: {SECTIONS}")

    if args.accelerator_report:
        return _accelerator_report(args, argv)
    q = args.quick
    if args.peer:
        peers.require(args.peer)  # fail in a second, not after the other sections
    elif args.only == ("peer",):
        raise SystemExit("--only peer: name the peer library too, e.g. --peer torch")
    if args.render:
        import json
        with open(args.render) as f:
            recs = [json.loads(line) for line in f if line.strip().startswith("{")]
        section = args.section or ("quick" if q else "full")
        machine = dict(common.machine_info(), loadavg_start=None)  # not this process' load
        markdown.write(args.markdown, markdown.render(recs, machine,
                                                  args.render_command, section=section),
                     section=section)
        return 0
    records = []
    common.add_sink(records.append)
    machine = common.machine_info()
    print(f"# sptlib.bench on {machine['cpu']} ({machine['cores']} cores), jax "
          f"{machine['jax']}", file=sys.stderr, flush=True)

    if "mixers" in args.only:
        s = mixers.MixerSettings(
            repeats=args.repeats or (3 if q else 5),
            max_seconds=args.max_seconds or (2.0 if q else 15.0),
            memory_cap_bytes=args.memory_cap_gb * 2 ** 30, memory=args.memory,
            direct_max_length=args.direct_max_length or (256 if q else 1024),
            scaling_passes=(2 if q else 3) if args.scaling_passes is None
            else args.scaling_passes)
        lengths = args.lengths or ((1024, 4096) if q else (1024, 2048, 4096, 8192, 16384))
        names = args.mixers or mixers.ALL_MIXERS
        unknown = [n for n in names if n not in mixers.ALL_MIXERS]
        if unknown:
            raise SystemExit(f"--mixers: unknown {unknown}; known: {mixers.ALL_MIXERS}")
        mixers.run(lengths, names, s, kinds=args.kinds, baselines=False)
        if not args.no_baselines:
            blens = args.baseline_lengths or ((256, 1024) if q else lengths)
            for length in blens:
                for rec in baselines.bench_conv(length, s, args.kinds):
                    common.emit(rec)
                for rec in baselines.bench_scan(length, s, args.kinds):
                    common.emit(rec)

    peak = peak_cpu = None
    train_kw = dict(max_tokens=args.train_max_tokens or (512 if q else 2048),
                    max_length=args.train_max_length or (256 if q else 0),
                    repeats=args.repeats or 3)
    matmul_sizes = (1024, 2048) if q else (2048, 4096)
    if "train" in args.only or "matmul" in args.only:
        peak, peak_cpu = train_step.matmul_peak(matmul_sizes)
    if "train" in args.only:
        for spec in args.train_configs or (train_step.QUICK_CONFIGS if q else train_step.FULL_CONFIGS):
            try:
                rec = train_step.bench_config(spec, peak_flops=peak, peak_flops_cpu=peak_cpu,
                                         **train_kw)
            except Exception as e:  # noqa: BLE001 - one broken config must not end the run
                rec = {"name": f"train/{spec}", "kind": "error",
                       "error": f"{type(e).__name__}: {str(e)[:300]}"}
            common.emit(rec)

    if args.peer:  # --peer implies its section; `--only peer` runs nothing else
        s = mixers.MixerSettings()
        peers.run(args.peer, args.peer_lengths or ((1024, 4096) if q else (1024, 4096, 16384)),
                  s, rounds=5 if q else 15, max_seconds=6.0 if q else 20.0)

    if "pipeline" in args.only:
        def consumer(spec):
            try:
                return train_step.bench_config(spec, peak_flops=peak, peak_flops_cpu=peak_cpu,
                                          **train_kw)
            except Exception:  # noqa: BLE001
                return None
        saved = []
        if args.train_records:
            import json
            with open(args.train_records) as f:
                saved = [json.loads(line) for line in f if line.strip().startswith("{")]
        pipeline.run(args.pipelines, args.data_dir,
                     train_records=[r for r in records + saved if r.get("kind") == "train_step"],
                     measure_consumer=consumer, num_batches=30 if q else 100)

    if args.markdown:
        command = "python -m sptlib.bench " + " ".join(
            shlex.quote(a) for a in argv if not a.startswith("--markdown") and a != args.markdown)
        block = markdown.render(records, machine, command.strip(),
                              machine_end=common.machine_info(),
                              section=args.section or ("quick" if q else "full"))
        markdown.write(args.markdown, block, section=args.section or ("quick" if q else "full"))
        print(f"# wrote {args.markdown}", file=sys.stderr, flush=True)
    return 0


def _accelerator_report(args, argv):
    args.report_sections = args.report_sections or accel.SECTIONS
    bad = [s for s in args.report_sections if s not in accel.SECTIONS]
    if bad:
        raise SystemExit(f"--report-sections: unknown {bad}; known: {accel.SECTIONS}")
    machine = common.machine_info()
    print(f"# sptlib.bench --accelerator-report on {machine['backend']} {machine['devices'][:1]}"
          f"{' (tiny sizes)' if args.tiny else ''}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    records = accel.run(tiny=args.tiny, budget_s=args.report_budget_s,
                        sections=args.report_sections)
    tables = accel_tables.render(records, machine)
    command = "python -m sptlib.bench " + " ".join(
        shlex.quote(a) for a in argv if not a.startswith("--markdown") and a != args.markdown)
    print(f"\n{tables}\n({time.perf_counter() - t0:.0f} s)", flush=True)
    if args.markdown:
        begin, end = markdown.markers("accelerator")
        block = "\n".join([begin, "", f"Command: `{command.strip()}`", "",
                           f"Run: {time.strftime('%Y-%m-%d %H:%M')}, "
                           f"{time.perf_counter() - t0:.0f} s.", "", tables, end]) + "\n"
        markdown.write(args.markdown, block, section="accelerator")
        print(f"# wrote {args.markdown}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
