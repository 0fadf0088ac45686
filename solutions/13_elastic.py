# Solutions to the exercises of notebooks/13_elastic.py
# (see solutions/02_baseline.py for how they are used).

# %% tags=["ex13_1"]
# The largest step any process reached (43), plus one: a step every process can still stop at.
agreed_step = 43 + 1

# %% tags=["ex13_2"]
# The same global batch of 96, over the 3 devices left.
survivor_batch = 96 // 3

# %% tags=["ex13_3"]
# Daly's interval with x = save / (2 MTBF): sqrt(2 save MTBF) (1 + sqrt(x) / 3 + x / 9) - save, in seconds
# (Young's first-order sqrt(2 x 30 x 21600) = 1138 s is close).
save_s, mtbf_s = 30.0, 6 * 3600.0
x = save_s / (2 * mtbf_s)
checkpoint_interval = (2 * save_s * mtbf_s) ** 0.5 * (1 + x**0.5 / 3 + x / 9) - save_s
