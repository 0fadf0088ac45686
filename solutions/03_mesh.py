# Solutions to the exercises of notebooks/03_mesh.py
# (see solutions/02_baseline.py for how they are used).

# %% tags=["ex03_1"]
# Naming 'data' at a position divides that dimension by the n devices; P() replicates.
rows, cols = 48, 784
shard_shapes = (
    (rows // n, cols) if rows % n == 0 else None,
    (rows, cols // n) if cols % n == 0 else None,
    (rows, cols),
)

# %% tags=["ex03_2"]
# One dimension, split over 'data' like the images' first dimension.
label_sharding = NamedSharding(mesh, P("data"))
