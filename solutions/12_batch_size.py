# Solutions to the exercises of notebooks/12_batch_size.py
# (see solutions/02_baseline.py for how they are used).

# %% tags=["ex12_1"]
# Squared norms; b = 32 is one device's batch, B = 256 the global one.
b, big_b = 32, 256
local_sq, global_sq = 1.30**2, 0.60**2
g2 = (big_b * global_sq - b * local_sq) / (big_b - b)
trace = (local_sq - global_sq) / (1 / b - 1 / big_b)
noise_scale = trace / g2

# %% tags=["ex12_2"]
# S(B) = S_min + E_min / B.
steps_at_new_batch = fit.s_min + fit.e_min / new_batch

# %% tags=["ex12_3"]
# Time to the target is steps x ms/step; take the smallest.
best_devices = min(check.DEVICE_TABLE, key=lambda row: row["steps"] * row["ms/step"])["devices"]
