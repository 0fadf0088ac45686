# Solutions to the exercises of notebooks/10_sharded.py
# (see solutions/02_baseline.py for how they are used).

# %% tags=["ex10_1"]
# Parameters stay whole (4 bytes each); the two AdamW moments (8 bytes per
# parameter) are sharded over the 4 devices.
zero1_bytes = 4 * 1_863_690 + 8 * 1_863_690 / 4

# %% tags=["ex10_2"]
# 49,152 / 8 GPUs = 6,144 examples per GPU per step; at most 1,024 at once:
# K >= 6, and 49,152 / 6 = 8,192 divides over the 8 GPUs.
accum_k = 6
