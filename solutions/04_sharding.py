# Solutions to the exercises of notebooks/04_sharding.py
# (see solutions/02_baseline.py for how they are used).

# %% tags=["ex04_1"]
# A collective inside the backward scan runs once per block repeat: doubling the
# repeats doubles its executions; the ones outside the loop still run once.
runs_per_step_doubled = report.runs_per_step + sum(
    c.runs_per_step for c in report.collectives if c.in_loop
)

# %% tags=["ex04_2"]
my_global_batch = (100 // n) * n  # a multiple of the device count
x_mine = jax.device_put(dataset.images[:my_global_batch], NamedSharding(mesh, P("data", None)))
