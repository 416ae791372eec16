"""sptlib: self-pretraining (SPT) and fair comparison of long-sequence models in JAX/Flax."""

from setuptools import find_packages, setup

# Pins that install together on Python 3.11 (see README); TensorFlow and TensorBoard are needed by
# clu's metric writers and by TFDS dataset preparation only.
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "grain==0.2.18",
    "tensorflow-datasets==4.9.10",
    "ml-collections==1.1.0",
    "clu==0.0.12",
    "tensorflow-cpu==2.21.0",
    "tensorboard==2.21.0",
    "absl-py",
    "etils[epath]",
    "numpy",
    "pillow",
    "tqdm",
    "matplotlib",
    "scipy",
]

LIBTPU = "libtpu==0.0.42.*"
RUFF = "ruff==0.17.6"
TEST_REQUIRES = ["pytest", "pytest-xdist", "pytest-timeout", LIBTPU]

setup(
    name="sptlib",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.11",
    packages=find_packages(include=["sptlib", "sptlib.*"]),
    # The native CPU kernels' C++ sources, compiled on first use (sptlib.kernels.native).
    package_data={"sptlib.kernels": ["cpu/*.cc", "cpu/*.h"]},
    install_requires=INSTALL_REQUIRES,
    extras_require={
        # libtpu as jax[tpu] pins it for this jax: `python -m sptlib.aot` compiles for TPU slices
        # with it on any machine; training on TPU VMs uses it too. CPU training never needs it.
        "tpu": [LIBTPU],
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
