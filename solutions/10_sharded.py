# Solutions to the exercises of notebooks/10_sharded.py (see solutions/02_baseline.py for how they are used).

# %% tags=["ex10_1"]
# Parameters stay whole (4 bytes each); the two AdamW moments (8 bytes per
# parameter) are sharded over the 4 devices.
zero1_bytes = 4 * 1_863_690 + 8 * 1_863_690 / 4

# %% tags=["ex10_2"]
# 32,768 / 8 GPUs = 4,096 examples per GPU per step; at most 1,024 at once.
accum_k = 4
