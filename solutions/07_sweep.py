# Solutions to the exercises of notebooks/07_sweep.py
# (see solutions/02_baseline.py for how they are used).

# %% tags=["ex07_1"]
# Throughput B / (a + b B) tends to 1 / b; B / (a + b B) = 0.9 / b gives B = 9 a / b.
ran = sorted(
    (pt.global_batch, pt.result.ms_per_step / 1000.0) for pt in points if pt.status == "ok"
)
plateau_answer = (None, None)
if len(ran) >= 2:
    (b1, t1), (b2, t2) = ran[0], ran[-1]
    b = (t2 - t1) / (b2 - b1)
    a = t1 - b * b1
    if a > 0 and b > 0:
        plateau_answer = (1.0 / b, 9.0 * a / b)

# %% tags=["ex07_2"]
n_gpus, link_bytes_per_s = 4, 32e9
allreduce_ms = 2 * (n_gpus - 1) / n_gpus * costs.gradient_bytes(cfg) / link_bytes_per_s * 1e3
