"""Launchers: Cloud TPU (`python -m sptlib.launch.tpu`) and Slurm GPU clusters (`python -m sptlib.launch.slurm`)."""
