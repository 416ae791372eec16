"""`get_task(config.data) -> Task`: one entry point for every task (docs/architecture.md, "Data").

Each task's builder registers itself (`sptlib.data.registry.register`), beside its reader or, for
the file-backed tasks with a TFDS copy, in `file_tasks.py`; importing the modules below fills the
registry. Task defaults (LRA / the SPT paper):
  listops          tokens, 10 classes, 2000 long          <lra_dir>/listops-1000/   (listops.py)
  text             bytes, 2 classes, 4096                  TFDS imdb_reviews (text.py)
  retrieval        bytes, pairs, 2 classes, 4000 per doc   <lra_dir>/tsv_data/       (aan.py)
  image            CIFAR-10 greyscale, 1024                TFDS cifar10 (cifar.py)
  scifar           CIFAR-10 RGB, 1024 x 3                  TFDS cifar10 (cifar.py)
  pathfinder       32 x 32 = 1024, 2 classes              <lra_dir>/pathfinder32/<difficulty>/
  pathx / pathx256 128 x 128 = 16384 / 256 x 256 = 65536   <lra_dir>/pathfinder{128,256}/
  speech_commands  raw 16 kHz audio, 16000, 35 classes     <speech_commands_dir>/ (SC35, v0.02)
  fashion_mnist    784 (or 196 at resolution 14), 10       /usr/share/datasets/fashion-mnist/
  lines            R x R (default 16 x 16), 4 classes      generated in memory (orientation.py)
  code_lm          causal LM, bytes, windows of 512        Python source of installed packages
  code_bytes       bytes, 10 classes (packages), 2048      the same sources (code_bytes.py)
  pg19 / lm1b      causal LM (SentencePiece or bytes)      TFDS pg19 / lm1b (lm.py, causal_lm.py)
  associative_recall / selective_copying  per-position labels, 128 / 256   generated in memory
                                                           (probes.py, probe_tasks.py)
  mad_* / mqar / induction_heads  the MAD suite, MQAR, induction heads    generated in memory
                                  (per-position labels; MAD baselines)     (mad.py)
  files            the user's JSON Lines / CSV / Parquet / NumPy files (user_files.py)
  pkg.module:build the user's own builder, by import path
Every `Task.info` (and so its sequence length) is `sptlib.data.defaults.task_info(config.data)`.
"""

# Imported for their `register` calls: every task's builder.
from sptlib.data import causal_lm, cifar, code_bytes, fashion_mnist, file_tasks  # noqa: F401
from sptlib.data import orientation, probe_tasks, text  # noqa: F401
from sptlib.data import user_code
from sptlib.data import user_files
from sptlib.data.config import TASKS
from sptlib.data.registry import BUILDERS, Task, register

__all__ = ["Task", "get_task"]


@register("files")
def build_files(cfg):
    """The user's own files (`config.data.files`; sptlib/data/user_files.py)."""
    spec = user_files.infer(cfg)
    return Task(cfg, user_files.info(spec),
                lambda split: user_files.load_split(cfg, spec, split))


def get_task(cfg):
    """Builds the Task for `cfg.task` (a `data_config()`, or the user's import path)."""
    if user_code.is_import_path(cfg.task):
        return user_code.build_task(cfg)
    if cfg.task not in TASKS:
        raise ValueError(f"unknown task {cfg.task!r}; expected one of {TASKS}")
    if cfg.input_type not in ("tokens", "continuous"):
        raise ValueError(f"input_type must be tokens|continuous, got {cfg.input_type!r}")
    if cfg.source not in ("files", "tfds"):
        raise ValueError(f"source must be files|tfds, got {cfg.source!r}")
    return BUILDERS[cfg.task](cfg)
