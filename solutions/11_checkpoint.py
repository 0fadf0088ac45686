# Solutions to the exercises of notebooks/11_checkpoint.py
# (see solutions/02_baseline.py for how they are used).

# %% tags=["ex11_1"]
# Parameters (4 bytes each) and AdamW's two moments (4 + 4), every array once.
checkpoint_bytes = 12 * 1_863_690

# %% tags=["ex11_2"]
# The save of step 400 was never committed; the last complete step is 300.
resume_step = 300
