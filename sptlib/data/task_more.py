"""Builders of the tasks other than ListOps (registered into `tasks`)."""
