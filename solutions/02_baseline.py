# Solutions to the exercises of notebooks/02_baseline.py, one cell per exercise,
# tagged with the exercise's id. `python -m coursetools run --solutions` and
# `make solutions-test` put each cell in place of the exercise cell and run the
# lesson; every check must then report "Correct". Names come from the lesson.

# %% tags=["ex02_1"]
# Only the hidden block repeats; 2 FLOPs per multiply-accumulate, x 3 for forward + backward.
width, repeats = cfg.width, 2 * cfg.block_repeats
flops_doubled = 6 * (784 * width + repeats * width * width + width * 10)


# %% tags=["ex02_2"]
def sgd_step(params, x, y, learning_rate):
    grads = jax.grad(lambda p: model.loss_and_metrics(p, x, y, cfg)[0])(params)
    return jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)


# %% tags=["ex02_3"]
# MFU = FLOPs per step / (step time x peak), so step time = FLOPs / (MFU x peak).
step_ms_at_40_percent = costs.train_flops_per_step(cfg_full, 1024) / (0.40 * 495e12) * 1e3
