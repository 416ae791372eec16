"""sptlib's layout for setuptools; the metadata and dependencies are in pyproject.toml.

A clone keeps the experiment configs and the launchers at its top level (`experiments/`,
`launch/`: the folders a user edits and submits with); the wheel installs them inside the package
as `sptlib.experiments` and `sptlib.launch`, so `--config=experiments/X.py` and
`python -m sptlib.launch.tpu` work from any folder (sptlib.config_paths).
"""

from setuptools import find_packages, setup

PACKAGES = find_packages(include=["sptlib", "sptlib.*"])
# Top-level folder -> the subpackage it is installed as.
MAPPED = {"sptlib.experiments": "experiments", "sptlib.launch": "launch"}
for name, folder in MAPPED.items():
    PACKAGES += [name] + [f"{name}.{p}" for p in find_packages(where=folder)]

setup(
    packages=PACKAGES,
    package_dir=MAPPED,
    # The CPU kernels' C++ sources, compiled on first use (sptlib.kernels.platform.cpu); the Slurm
    # batch-script template (sptlib.launch.slurm); the PEP 561 marker (sptlib ships its types).
    package_data={"sptlib": ["py.typed"], "sptlib.kernels.platform.cpu": ["*.cc", "*.h"],
                  "sptlib.launch": ["*.sbatch"]},
)
