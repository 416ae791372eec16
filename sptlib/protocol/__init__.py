"""The comparison protocol: every model self-pretrained, then judged against scratch.

`compare` (the grid of models x regimes x seeds [x lrs x data fractions] and its table; `grid`
expands it), `equal_compute` (the equal-compute control's steps when stages train to
convergence), `stops` (where such stages stopped),
`compare_jobs` (the grid as one process per core), `stages` (one run: its stages in order, each
checkpoint chained into the next), `records` (a run's results -> one record), `report`,
`lmreport` and `learning_curves` (tables and plots), `stats` (means with t intervals),
`sweeps` (the lr axis, chosen on validation), `lengthgen` and `lmeval` (evaluation at other
lengths), `aot` (every stage compiled for its TPU slice, behind `python -m sptlib.aot`). Nothing
below this package imports it.
"""
