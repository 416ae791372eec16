"""The data section of every experiment config (`config.data`), with a comment per field.

`sptlib.data.get_task(config.data)` turns it into a `Task` (see docs/architecture.md, "Data").
Zero / empty values mean "the task's default" (e.g. `max_length=0` -> 2000 for ListOps).
"""

import os

import ml_collections

from sptlib.data import lm, mad, user_files

DATA_ENV = "SPTLIB_DATA"


def data_root() -> str:
    """The folder for task data sptlib generates or a user downloads once, when a config names
    none: `$SPTLIB_DATA`, else `$XDG_CACHE_HOME/sptlib/data`, else `~/.cache/sptlib/data`.
    Never the current folder: a run writes nothing outside its workdir unless asked to."""
    if os.environ.get(DATA_ENV):
        return os.path.abspath(os.path.expanduser(os.environ[DATA_ENV]))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(cache), "sptlib", "data")

TASKS = ("listops", "text", "retrieval", "image", "scifar", "pathfinder", "pathx", "pathx256",
         "speech_commands", "fashion_mnist", "lines", "code_lm", "pg19", "lm1b",
         "arxiv", "code_bytes", "associative_recall", "selective_copying", *mad.PROBES, "files")


def data_config():
    """Returns the default data config (ListOps from `lra_dir`); experiments override fields."""
    c = ml_collections.ConfigDict()
    # Task: listops | text | retrieval | image | scifar | pathfinder | pathx | pathx256 |
    # speech_commands | fashion_mnist | lines (generated in memory, sptlib/data/orientation.py) |
    # code_lm | pg19 | lm1b | arxiv (causal LM windows, sptlib/data/lm.py) | code_bytes (which
    # package a window of Python source is from, sptlib/data/code_bytes.py) |
    # associative_recall | selective_copying (synthetic per-position labelling probes generated
    # in memory, sptlib/data/probes.py; sizes in `probes` below) | mad_in_context_recall |
    # mad_noisy_recall | mad_fuzzy_recall | mad_selective_copying | mad_compression |
    # mad_memorization | mqar | induction_heads (the MAD suite, zoology's MQAR and induction
    # heads, sptlib/data/mad.py; same `probes` below) | files (the user's own files,
    # `files` below; sptlib/data/user_files.py, docs/your_data.md) | "package.module:build" (the
    # user's own builder, `build(config.data) -> sptlib.data.registry.Task`; docs/data.md).
    c.task = "listops"
    # Folder that holds the LRA release layout (`listops-1000/`, `tsv_data/`, `pathfinder32/`, ...);
    # default `<data_root()>/lra_release` (generated smoke / quickstart sets land there too).
    c.lra_dir = os.path.join(data_root(), "lra_release")
    # Folder of the raw Speech Commands v0.02 release (35 word folders, validation_list.txt,
    # testing_list.txt; sptlib/data/speech_commands.py).
    c.speech_commands_dir = "speech_commands_v0.02"
    # TFDS data directory for TFDS-backed tasks (text, image, scifar) and for the prepared
    # ArrayRecord copies of the LRA and Speech Commands releases (source='tfds'); '' = TFDS's
    # default.
    c.tfds_data_dir = ""
    # Where LRA release tasks and Speech Commands are read from: files (parse the release files /
    # decode PNGs and WAVs on access) | tfds (prepare an ArrayRecord TFDS dataset once under
    # tfds_data_dir, then read it with random access). TFDS-backed tasks always use TFDS.
    c.source = "files"
    # Maximum sequence length (longer examples are truncated and counted); 0 = task default
    # (listops 2000, text 4096, retrieval 4000 per document, image 1024, pathfinder R*R, ...).
    c.max_length = 0
    # tokens: int32 ids [batch, length] (pad 0, <mask> 1, real from 2) | continuous: float32
    # [batch, length, channels] normalised values plus `raw` int32 0..255. Text-like tasks
    # (listops, text, retrieval) support tokens only.
    c.input_type = "tokens"
    # Image side in pixels: pathfinder 32|64|128|256 (pathx = 128, pathx256 = 256 when 0);
    # fashion_mnist 28 or 14 (2x2 average-pooled); lines any side >= 8 (16); 0 = task default.
    c.resolution = 0
    # Pathfinder difficulty folder: curv_baseline | curv_contour_length_9 | curv_contour_length_14.
    c.difficulty = "curv_contour_length_14"
    # Fraction of the training split used (validation/test untouched). Subsets are nested: a
    # fixed-seed permutation of the training indices is cut, so 1% is inside 5% inside 100%.
    c.data_fraction = 1.0
    # Seed of that permutation (kept apart from the shuffling seed so subsets stay fixed).
    c.data_fraction_seed = 0
    # Generate the task's files when they are missing under lra_dir (listops, pathfinder,
    # pathx, pathx256 only); used by the tiny smoke configs and the quickstart.
    c.generate = ml_collections.ConfigDict()
    # Off by default: a missing lra_dir is an error that says how to get the data.
    c.generate.enabled = False
    # Split sizes (pathfinder: the total is generated and split 80/10/10 like the release).
    c.generate.num_train = 2000
    c.generate.num_val = 200
    c.generate.num_test = 200
    # Generator seed (the same seed gives byte-identical files).
    c.generate.seed = 0
    # ListOps length window (tokens of the source string, exclusive bounds as in LRA).
    c.generate.min_length = 500
    c.generate.max_length = 2000
    # Pathfinder contour length of generated sets: 6 (curv_baseline) | 9 | 14; 0 = from difficulty.
    c.generate.contour_length = 0
    # Lines: background noise amplitude (pixels uniform in [0, noise]; 0 = black background).
    c.generate.noise = 0.25
    # Lines: segments (one segment among dots) | gratings (striped images, noise as above).
    c.generate.style = "segments"
    # Grain multiprocessing workers (0 = read in threads of the main process).
    c.num_workers = 0
    # Reader threads per worker (or in the main process) and batches prefetched ahead.
    c.read_threads = 4
    c.prefetch_buffer_size = 64
    # Folder with the Fashion-MNIST idx files (Debian package dataset-fashion-mnist).
    c.fashion_mnist_dir = "/usr/share/datasets/fashion-mnist"
    # fashion_mnist / code_bytes: evaluate on the first this many test examples only (0 = all;
    # both test sets are in no particular class order). CPU-sized grids use it to cut the cost of
    # the two final test evaluations per stage.
    c.test_examples = 0
    # Causal LM tasks (code_lm | pg19 | lm1b): corpus and windows (sptlib.data.lm.lm_config).
    c.lm = lm.lm_config()
    c.code_bytes = code_bytes_config()
    c.probes = probes_config()
    c.files = user_files.files_config()
    return c


def probes_config():
    """`config.data.probes`: the synthetic probes (sptlib/data/probes.py, probe_tasks.py). The
    sequence length is `data.max_length` (0 = 128 for associative_recall, 256 for
    selective_copying)."""
    c = ml_collections.ConfigDict()
    # associative_recall: key-value pairs per sequence, key and value vocabularies, and keys
    # queried (0 = every key once).
    c.num_pairs = 16
    c.key_vocab = 64
    c.value_vocab = 64
    c.num_queries = 0
    # selective_copying: data tokens scattered among blanks, and their vocabulary.
    c.num_tokens = 16
    c.data_vocab = 16
    # The MAD tasks, mqar and induction_heads (sptlib/data/mad.py): the task's own vocabulary
    # (MAD's `vocab_size`: keys, values and noise tokens; mqar: keys and values), noise tokens and
    # the fraction of noise pairs (mad_*_recall), the largest key / value motif
    # (mad_fuzzy_recall), the fixed key-value map's seed (mad_memorization) and the power law of
    # the query gaps (mqar; 1 = uniform). mqar's pairs are `num_pairs`.
    c.vocab_size = 16
    c.noise_vocab = 0
    c.frac_noise = 0.0
    c.motif_size = 3
    c.kv_map_seed = 12345
    c.power_a = 0.01
    # Sequences per split; train, validation and test come from three disjoint random streams of
    # `seed` (sptlib.data.probes.SPLIT_TAGS), so the same seed gives the same splits.
    c.num_train = 16000
    c.num_val = 1000
    c.num_test = 1000
    c.seed = 0
    return c


def code_bytes_config():
    """`config.data.code_bytes`: the source-code classification task (sptlib/data/code_bytes.py)."""
    c = ml_collections.ConfigDict()
    # Import names of the installed packages, one class each (class id = position).
    c.packages = ("flax", "grain", "jax", "matplotlib", "numpy", "optax", "orbax", "pip",
                  "scipy", "setuptools")
    # '' = the installed packages; else a folder with one sub-folder of *.py files per package.
    c.root = ""
    # Lines removed at the top of every file (license header, docstring start); import lines
    # are removed everywhere.
    c.header_lines = 20
    # Bytes per window (0 = max_length); the model reads the first max_length bytes of each.
    c.window = 0
    # At most this many windows per file (evenly spaced over it).
    c.max_windows_per_file = 16
    # Percent of each package's windows (whole files, in path-hash order) in validation / test.
    c.validation_percent = 15
    c.test_percent = 15
    return c
