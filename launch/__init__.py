"""Launchers: Cloud TPU (`python -m launch.tpu`) and Slurm GPU clusters (`python -m launch.slurm`)."""
