"""Launchers: Cloud TPU (`python -m sptlib.launch.tpu`) and Slurm GPU clusters (`python -m sptlib.launch.slurm`).

A clone keeps them at its top level (`launch/`); the wheel installs this folder as `sptlib.launch`
(setup.py)."""
