"""Sharded train-state initialisation, jit-compiled train / eval steps, the parameters' fingerprint.

Shardings come from the parameters' logical axis names (`nn.with_logical_partitioning`) through
the config's logical-axis rules. Parameters are created directly in their shards (`jax.jit` with
`out_shardings`), so no host ever holds a full copy; optimizer moments follow their parameter's
sharding; scalars and the rng are replicated.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from sptlib.kernels import platform as platform_lib
from sptlib.layers import param_groups
from sptlib.train import checkpoint_io
from sptlib.train import digest as digest_lib
from sptlib.train import sharding as sharding_lib
from sptlib.train.state import TrainState


def _match_param_shardings(tree, param_shardings, params_abstract, default):
    """Shardings for a tree (e.g. the optimizer state) whose leaves mirror parameters.

    A leaf gets its parameter's sharding when the tail of its key path is that parameter's path
    and the shapes agree (Adam's `mu`/`nu`); every other leaf (counts, scalars) gets `default`.
    """
    by_path = {}
    for path, s in jax.tree_util.tree_flatten_with_path(param_shardings)[0]:
        by_path[digest_lib.leaf_names(path)] = s
    shapes = {digest_lib.leaf_names(p): tuple(x.shape)
              for p, x in jax.tree_util.tree_flatten_with_path(params_abstract)[0]}
    max_depth = max((len(k) for k in by_path), default=0)

    def one(path, leaf):
        names = digest_lib.leaf_names(path)
        shape = tuple(getattr(leaf, "shape", ()))
        for n in range(min(len(names), max_depth), 0, -1):
            tail = names[-n:]
            if tail in by_path and shapes[tail] == shape:
                return by_path[tail]
        return default

    return jax.tree_util.tree_map_with_path(one, tree)


def _first_example(v):
    """`v[:1]` as a jnp array; zeros of that shape for an abstract `ShapeDtypeStruct`."""
    if isinstance(v, jax.ShapeDtypeStruct):
        return jnp.zeros((1,) + tuple(v.shape[1:]), v.dtype)
    return jnp.asarray(np.asarray(v)[:1])


def _init_variables(model, objective, example_batch, rng):
    """`model.init` on a one-example slice of the batch (shapes only matter; the batch may be
    `ShapeDtypeStruct`s)."""
    example = {k: _first_example(v) for k, v in example_batch.items()}
    if objective is not None:
        kwargs = objective.init_inputs(example)
    else:
        kwargs = {"inputs": example["inputs"], "mask": example["mask"]}
        if "inputs2" in example:
            kwargs["inputs2"], kwargs["mask2"] = example["inputs2"], example["mask2"]
    # Real-looking (non-padding) dummy data: only the shapes are used.
    kwargs = {k: (jnp.ones_like(v) if k.startswith("mask") else v) for k, v in kwargs.items()}
    params_rng, dropout_rng = jax.random.split(rng)
    return model.init({"params": params_rng, "dropout": dropout_rng}, deterministic=True,
                      **kwargs)


def state_logical_specs(model, objective, example_batch):
    """Abstract variables and the logical PartitionSpecs of params and model state."""
    abstract = jax.eval_shape(
        lambda r: _init_variables(model, objective, example_batch, r), jax.random.PRNGKey(0))
    specs = nn.get_partition_spec(abstract)
    # Unboxed, but SSM-group shapes stay marked: `optim.make_optimizer` reads the groups here.
    return param_groups.unbox_abstract(abstract), specs


def _state_shardings_and_init(model, optimizer, example_batch, mesh, rules, objective):
    """The `TrainState` of `NamedSharding`s and the `rng -> TrainState` init function."""
    abstract, specs = state_logical_specs(model, objective, example_batch)
    var_shardings = sharding_lib.logical_to_sharding(specs, abstract, mesh, rules)
    abstract_params = abstract["params"]
    param_shardings = var_shardings["params"]
    model_state_shardings = {k: v for k, v in var_shardings.items() if k != "params"}
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
    repl = sharding_lib.replicated(mesh)
    opt_shardings = _match_param_shardings(abstract_opt, param_shardings, abstract_params, repl)
    state_shardings = TrainState(step=repl, params=param_shardings, opt_state=opt_shardings,
                                 model_state=model_state_shardings, rng=repl)

    def make_state(r):
        init_r, state_r = jax.random.split(r)
        variables = nn.unbox(_init_variables(model, objective, example_batch, init_r))
        params = variables.pop("params")
        return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                          opt_state=optimizer.init(params), model_state=dict(variables),
                          rng=state_r)

    return state_shardings, make_state


def init_train_state(model, optimizer, example_batch, rng, mesh, rules, objective=None):
    """Creates the train state, every array already placed in its shards.

    Args:
      model: the Linen model (`sptlib.models.build_model`).
      optimizer: `optax.GradientTransformation` (`sptlib.train.optim.make_optimizer`).
      example_batch: a batch (dict of arrays; only shapes/dtypes are used).
      rng: PRNG key; split into the parameter init key and `state.rng` (dropout / masking).
      mesh: the mesh (`sharding.create_mesh`).
      rules: logical axis rules.
      objective: the stage's `Objective`; needed for continuous inputs with a mask-indicator
        channel (the objective, not the model, appends the channel). Without it the model is
        initialised on the raw inputs.

    Returns:
      `(state, state_shardings)`: a `TrainState` and a `TrainState` of `NamedSharding`s.
    """
    rules = sharding_lib.normalize_rules(rules)
    state_shardings, make_state = _state_shardings_and_init(model, optimizer, example_batch,
                                                            mesh, rules, objective)
    options = platform_lib.init_compiler_options(mesh.devices.flat[0].platform)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        state = jax.jit(make_state, out_shardings=state_shardings,
                        compiler_options=options)(rng)
    return state, state_shardings


def abstract_train_state(model, optimizer, example_batch, mesh, rules, objective=None):
    """Like `init_train_state`, but allocates nothing: the state is `ShapeDtypeStruct`s that
    carry their shardings (for ahead-of-time compilation on devices this host may not have,
    e.g. a TPU topology). `example_batch` may be `ShapeDtypeStruct`s too.

    Returns:
      `(abstract_state, state_shardings)`.
    """
    rules = sharding_lib.normalize_rules(rules)
    state_shardings, make_state = _state_shardings_and_init(model, optimizer, example_batch,
                                                            mesh, rules, objective)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        shapes = jax.eval_shape(make_state, jax.ShapeDtypeStruct((2,), jnp.uint32))
    state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                         shapes, state_shardings)
    return state, state_shardings


def _scalar_metrics(metrics):
    """Ensures every metric value is a `(sum, count)` pair of float32 scalars."""
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), metrics)


def make_train_step(model, objective, optimizer, mesh, state_shardings, rules, *,
                    compiler_options=None):
    """A jit-compiled `(state, batch) -> (state, metrics)` train step.

    The state is donated (its buffers are reused for the new state: do not touch the old one
    after the call). `batch` should be global arrays from `sharding.shard_batch` (NumPy arrays
    are accepted in single-process runs). Metrics are replicated `(sum, count)` scalar pairs:
    the objective's plus `grad_norm` (global L2 norm, count 1).

    Dropout / masking keys are `fold_in(state.rng, state.step)`, so a resumed run draws the
    same masks as an uninterrupted one. `compiler_options` go to `jax.jit` (e.g.
    `{"xla_backend_optimization_level": 0}` compiles ~2x faster on CPU for short runs).
    """
    rules = sharding_lib.normalize_rules(rules)
    data_sharding = sharding_lib.batch_sharding(mesh, rules)
    repl = sharding_lib.replicated(mesh)

    def step(state, batch):
        rng = jax.random.fold_in(state.rng, state.step)

        def loss_fn(params):
            variables = {"params": params, **state.model_state}
            loss, metrics, new_model_state = objective.loss(
                model.apply, variables, batch, rng, train=True)
            return loss, (metrics, new_model_state)

        grads, (metrics, new_model_state) = jax.grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = jax.tree.map(lambda p, u: (p + u).astype(p.dtype), state.params, updates)
        metrics = dict(metrics)
        metrics["grad_norm"] = (jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32)))
                                             for g in jax.tree.leaves(grads))), 1.0)
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                                  model_state=new_model_state)
        return new_state, _scalar_metrics(metrics)

    jitted = jax.jit(step, in_shardings=(state_shardings, data_sharding),
                     out_shardings=(state_shardings, repl), donate_argnums=(0,),
                     compiler_options=compiler_options)

    return _callable_in_context(jitted, mesh, rules)


def make_eval_step(model, objective, mesh, state_shardings, rules, *, compiler_options=None):
    """A jit-compiled `(state, batch) -> metrics` evaluation step (no dropout, no donation).

    Masked-SPT evaluation masks are fixed by the objective's `eval_seed` and the batch, so all
    checkpoints are scored on the same positions.
    """
    rules = sharding_lib.normalize_rules(rules)
    data_sharding = sharding_lib.batch_sharding(mesh, rules)
    repl = sharding_lib.replicated(mesh)

    def step(state, batch):
        variables = {"params": state.params, **state.model_state}
        _, metrics, _ = objective.loss(model.apply, variables, batch,
                                       jax.random.PRNGKey(0), train=False)
        return _scalar_metrics(metrics)

    jitted = jax.jit(step, in_shardings=(state_shardings, data_sharding), out_shardings=repl,
                     compiler_options=compiler_options)

    return _callable_in_context(jitted, mesh, rules)


def _callable_in_context(jitted, mesh, rules):
    """`(state, batch) -> jitted(state, batch)` under the step's mesh and logical rules, with
    `.jitted`, `.lower` and `.trace` (see `_in_context`) attached."""
    call = _in_context(jitted, mesh, rules)
    call.jitted = jitted
    call.lower = _in_context(jitted.lower, mesh, rules)
    call.trace = _in_context(jitted.trace, mesh, rules)
    return call


def _in_context(method, mesh, rules):
    """`jitted.lower` / `jitted.trace` under the step's mesh and logical rules. Arguments may be
    abstract `ShapeDtypeStruct`s with shardings: `.lower(state, batch).compile()` compiles ahead
    of time, also for devices this host does not have."""

    def call(*args):
        with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
            return method(*args)

    return call


def params_fingerprint(params):
    """SHA-256 (hex) of the parameters' digests (`sptlib.train.digest`: path -> SHA-256 of dtype,
    shape and bytes), the same digests a checkpoint records. Every process must call it (arrays
    spread over processes are all-gathered); every process gets the same string. Bitwise: any
    change of any parameter changes it."""
    return digest_lib.json_digest(digest_lib.array_digests(params, checkpoint_io.to_host))
