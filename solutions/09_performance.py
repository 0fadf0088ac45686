# Solutions to the exercises of notebooks/09_performance.py
# (see solutions/02_baseline.py for how they are used).

# %% tags=["ex09_1"]
# 2 B W^2 / (2 (2 B W + W^2)) = ridge  =>  B = 2 ridge W / (2 (W - 2 ridge)), if W > 2 ridge;
# a batch is whole: the smallest whole B at or above that.
W, ridge = 1024, 989e12 / 4.8e12
ridge_batch_h200 = math.ceil(2 * ridge * W / (2 * (W - 2 * ridge))) if 2 * ridge < W else math.inf

# %% tags=["ex09_2"]
# Rungs within 20 % of the target count either way; list those at or above it.
rungs_at_target = [
    row["rung"] for row in ladder_rows if (row["of measured ceiling"] or 0) >= target_09_2
]

# %% tags=["ex09_3"]
# The only all-reduce's window holds no compute: the sum. A change is right when its compile has
# more bytes inside windows than the plain step's (the small threshold, where the scheduler runs).
plain_f = fractions_09_3.get("plain", 0.0)  # {} without the GPU-compile extra: the check says so
opens = [c for c in check.CHANGES[:2] if fractions_09_3.get(c, 0.0) > plain_f]
overlap_09_3 = (costs.bound_for(plain_f), opens[0] if opens else "none of these")
