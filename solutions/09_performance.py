# Solutions to the exercises of notebooks/09_performance.py (see solutions/02_baseline.py for how they are used).

# %% tags=["ex09_1"]
# 2 B W^2 / (2 (2 B W + W^2)) = ridge  =>  B = 2 ridge W / (2 (W - 2 ridge)), if W > 2 ridge.
import math

if ridge_bf16 is None or cfg.width <= 2 * ridge_bf16:
    ridge_batch_bf16 = math.inf  # the intensity levels off at W / 2, below the ridge
else:
    ridge_batch_bf16 = 2 * ridge_bf16 * cfg.width / (2 * (cfg.width - 2 * ridge_bf16))

# %% tags=["ex09_2"]
rungs_at_target = [r.name for r, row in zip(rungs, ladder_rows) if (row["of measured ceiling"] or 0) >= 0.5]
