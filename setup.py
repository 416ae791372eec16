"""sptlib: self-pretraining (SPT) and fair comparison of long-sequence models in JAX/Flax."""

from setuptools import find_packages, setup

# Tested ranges, not pins, so that installing sptlib on a GPU or TPU host keeps the JAX that the
# host's plugin (jax-cuda12/13-plugin, libtpu) was installed for. The low ends are this machine's
# versions (CI installs exactly them: constraints.txt); the GPU host of the accelerator issue ran
# sptlib unchanged with jax 0.11.2, flax 0.12.10, optax 0.2.8 and orbax-checkpoint 0.12.4, hence
# orbax's lower end and jax's upper one (< 0.12: not tried). TensorFlow and TensorBoard are needed
# by clu's metric writers and by TFDS dataset preparation only.
INSTALL_REQUIRES = [
    "jax>=0.10.2,<0.12",
    "jaxlib>=0.10.2,<0.12",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.8,<0.3",
    "orbax-checkpoint>=0.12.4,<0.13",
    "grain>=0.2.18,<0.3",
    # The user's own Parquet / CSV files (config.data.task="files", sptlib/data/user_readers.py).
    "pyarrow>=26.0.1",
    "tensorflow-datasets>=4.9.10,<5",
    "ml-collections>=1.1.0,<2",
    "clu>=0.0.12,<0.1",
    "tensorflow-cpu>=2.21.0,<2.22",
    "tensorboard>=2.21.0,<2.22",
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
TEST_REQUIRES = ["pytest", "pytest-xdist", "pytest-timeout", TPU]

setup(
    name="sptlib",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.11",
    packages=find_packages(include=["sptlib", "sptlib.*"]),
    # The CPU kernels' C++ sources, compiled on first use (sptlib.kernels.platform.cpu).
    package_data={"sptlib.kernels.platform.cpu": ["*.cc", "*.h"]},
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
            "spt-compare=sptlib.protocol.compare:run",
        ]
    },
)
