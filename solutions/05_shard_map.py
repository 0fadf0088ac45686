# Solutions to the exercises of notebooks/05_shard_map.py (see solutions/02_baseline.py for how they are used).


# %% tags=["ex05_1"]
def grads_fn(params, x, y):
    def local(p, x, y):
        p = jax.lax.pcast(p, "data", to="varying")  # this device's own copy
        grads = jax.grad(lambda q: model.loss_and_metrics(q, x, y, cfg)[0])(p)
        return jax.lax.pmean(grads, "data")  # mean of equal shards' means = global mean

    return jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data", None), P("data")), out_specs=P())(params, x, y)


# %% tags=["ex05_2"]
# SGD: update = lr x gradient, n times too large. AdamW's first update is about
# lr x m / sqrt(v) with m ~ g and v ~ g^2: the scale cancels.
psum_factors = (n, 1.0)
