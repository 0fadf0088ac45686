# Solutions to the exercises of notebooks/06_pmap.py
# (see solutions/02_baseline.py for how they are used).


# %% tags=["ex06_1"]
def step_keys(seed, step):
    # fold_in mixes the step into the seed's key; the split then gives one key per device.
    return jax.random.split(jax.random.fold_in(jax.random.key(seed), step), n)


# %% tags=["ex06_2"]
# Parameters, Adam's first and second moments (same shapes, float32), and Adam's
# step count (one int32): all replicated, so every device holds all of it.
bytes_per_device = 3 * 4 * model.param_count(cfg) + 4
