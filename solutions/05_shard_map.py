# Solutions to the exercises of notebooks/05_shard_map.py
# (see solutions/02_baseline.py for how they are used).


# %% tags=["ex05_1"]
def masked_grads(params, x, y, m):
    def local(p, x, y, m):
        p = jax.lax.pcast(p, "data", to="varying")  # this device's own copy

        def masked_sum(q):
            logits = model.forward(q, x, cfg.block_repeats, cfg.block_mix)
            return (m * optax.softmax_cross_entropy_with_integer_labels(logits, y)).sum()

        grads = jax.grad(masked_sum)(p)  # this shard's sum, not its mean
        count = jax.lax.psum(m.sum(), "data")  # real examples on all devices
        return jax.tree.map(lambda g: jax.lax.psum(g, "data") / count, grads)

    specs = dict(in_specs=(P(), P("data", None), P("data"), P("data")), out_specs=P())
    return jax.shard_map(local, mesh=mesh, **specs)(params, x, y, m)


# %% tags=["ex05_2"]
# AdamW's first update is lr x m / (sqrt(v) + eps) with m ~ g and v ~ g^2: the
# scale cancels. nu = (1 - b2) g^2 grows with the square of the scale.
adamw_factors = (1.0, n**2)
