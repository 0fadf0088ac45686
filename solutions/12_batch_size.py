# Solutions to the exercises of notebooks/12_batch_size.py
# (see solutions/02_baseline.py for how they are used).

# %% tags=["ex12_1"]
# Squared norms; b = 32 is one device's batch, B = 256 the global one (section 2's noise_terms).
g2, trace = noise_terms(1.30**2, 0.60**2, 32, 256)
noise_scale = trace / g2

# %% tags=["ex12_2"]
# S(B) = S_min + E_min / B.
steps_at_new_batch = fit.s_min + fit.e_min / new_batch

# %% tags=["ex12_3"]
# Time to the target is steps x ms/step; take the smallest.
best_devices = min(check.DEVICE_TABLE, key=lambda row: row["steps"] * row["ms/step"])["devices"]
