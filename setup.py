"""sptlib: self-pretraining (SPT) and fair comparison of long-sequence models in JAX/Flax."""

from setuptools import find_packages, setup

# Tested ranges, not pins, so that installing sptlib on a GPU or TPU host keeps the JAX that the
# host's plugin (jax-cuda12/13-plugin, libtpu) was installed for. The low ends are this machine's
# versions (CI installs exactly them: constraints.txt); the GPU host of the accelerator issue ran
# sptlib unchanged with jax 0.11.2, flax 0.12.10, optax 0.2.8 and orbax-checkpoint 0.12.4, hence
# orbax's lower end and jax's upper one (< 0.12: not tried). No TensorFlow: training, compare, aot
# and bench never import it, and the TensorBoard event files are written with tensorboardX's
# protocol buffers (sptlib.train.metrics); TFDS and TensorFlow are the `tfds` extra.
INSTALL_REQUIRES = [
    "jax>=0.10.2,<0.12",
    "jaxlib>=0.10.2,<0.12",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.4,<0.13",
    "grain>=0.2.18,<0.3",
    # The user's own Parquet / CSV files (config.data.task="files", sptlib/data/user_readers.py).
    "pyarrow>=26.0.1",
    "ml-collections>=1.1.0,<2",
    "tensorboardX>=2.6.5,<3",
    "absl-py",
    "etils[epath]",
    "numpy",
    "pillow",
    "tqdm",
    "matplotlib",
    "scipy",
]

# libtpu as jax[tpu] pins it for the installed jax (0.0.42.* for jax 0.10.2, as constraints.txt).
TPU = "jax[tpu]"
RUFF = "ruff==0.17.6"
# TensorFlow Datasets with TensorFlow: the LRA and Speech Commands TFDS builders
# (config.data.source='tfds'), the TFDS sources of Text (imdb_reviews), sCIFAR (cifar10) and the
# LM corpora. Without it those paths stop with one line naming this extra (sptlib.data.sources).
TFDS = ["tensorflow-datasets>=4.9.10,<5", "tensorflow-cpu>=2.21.0,<2.22"]
# The tests exercise the TFDS builders, TensorFlow's log filtering (tests/test_logs.py), and read
# the event files back with TensorBoard's own reader (tests/test_event_writer.py).
TEST_REQUIRES = ["pytest", "pytest-xdist", "pytest-timeout", TPU, "tensorboard>=2.21.0,<2.22",
                 *TFDS]

setup(
    name="sptlib",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.11",
    # sptlib.experiments (the experiment configs) included: `--config=experiments/X.py` finds
    # them in the installed package (sptlib.configs.common.resolve_config_path).
    packages=find_packages(include=["sptlib", "sptlib.*"]),
    # The CPU kernels' C++ sources, compiled on first use (sptlib.kernels.platform.cpu).
    # The Slurm batch-script template (sptlib.launch.slurm).
    package_data={"sptlib.kernels.platform.cpu": ["*.cc", "*.h"], "sptlib.launch": ["*.sbatch"]},
    install_requires=INSTALL_REQUIRES,
    extras_require={
        # libtpu as jax[tpu] pins it for the installed jax: `python -m sptlib.aot` compiles for
        # TPU slices with it on any machine; training on TPU VMs uses it too. CPU training never
        # needs it.
        "tpu": [TPU],
        # NVIDIA GPUs: the CUDA 12 plugin and its CUDA libraries for the installed jax (jax's own
        # `cuda` extra); `cuda13` for CUDA 13 drivers. A host whose jax and plugin are already
        # installed (and within the ranges above) needs neither: `pip install -e .` keeps them.
        "cuda": ["jax[cuda12]"],
        "cuda13": ["jax[cuda13]"],
        "tfds": TFDS,
        # gs:// workdirs without TensorFlow: etils.epath reaches Cloud Storage through gcsfs
        # (with the `tfds` extra it uses TensorFlow's gfile instead).
        "gcs": ["gcsfs"],
        # The tests compile PathX steps for a TPU slice (tests/test_aot.py), so they need it.
        "test": TEST_REQUIRES,
        # The test suite plus the linter that .ci/run applies (rules in ruff.toml).
        "dev": TEST_REQUIRES + [RUFF],
        # SentencePiece for the paper-size GSS language models (experiments/gss_lm.py); never
        # needed on CPU or in tests.
        "lm": ["sentencepiece"],
    },
    entry_points={
        "console_scripts": [
            "spt-train=sptlib.main:run",
            "spt-compare=sptlib.compare:run",
        ]
    },
)
