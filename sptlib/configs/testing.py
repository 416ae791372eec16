"""Any experiment config shrunk to a test's size (`tiny`): the tests build and train every
preset for a step or two this way, so no config rots."""

from __future__ import annotations

import ml_collections


def tiny(config, *, steps: int = 2, d_model: int = 16, n_layers: int = 1,
         max_length: int = 64) -> ml_collections.ConfigDict:
    """Shrinks a config in place for tests: sizes, steps, lengths, batch, mesh (keeps every choice
    that selects code: mixer, pattern, encoder, attention kernel, remat, regime, objective)."""
    with config.unlocked():
        # Data parallelism over whatever devices the test has (paper meshes name a TPU slice).
        config.mesh.update(data=-1, fsdp=1, tensor=1)
        m = config.model
        m.d_model, m.n_layers = d_model, max(n_layers, 2 if m.pattern == "gss_hybrid" else 1)
        layers = m.get("layers")
        if layers:  # a free hybrid stack: one repeat of its pattern (or its whole list)
            from sptlib.models import build  # deferred: configs stay JAX-free until used
            m.n_layers = len(build.pattern_unit(layers) if isinstance(layers, str) else layers)
        m.attention.n_heads = min(m.attention.n_heads, 2)
        m.attention.window = min(m.attention.window, max_length // 2) if m.attention.window else 0
        m.attention.chunk_size = min(m.attention.chunk_size, max_length)
        for sub, key in (("s4", "d_state"), ("s4d", "d_state"), ("dss", "d_state"),
                         ("dlr", "d_state"), ("s5", "d_state"), ("gss", "d_state")):
            if sub in m and key in m[sub]:
                m[sub][key] = min(m[sub][key], 8)
        for name in config.stages:
            s = config.stages[name]
            s.num_steps = steps
            s.batch_size = 4
            s.eval_every = s.checkpoint_every = s.log_every = steps
            s.eval_steps = 1
            s.optim.warmup_steps = 0
        d = config.data
        d.max_length = max_length
        if d.task in ("pathfinder", "pathx", "pathx256", "lines"):
            d.resolution = 8 if max_length <= 64 else 16
            d.max_length = 0
    return config
