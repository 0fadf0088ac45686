# Solutions to the exercises of notebooks/08_multihost.py
# (see solutions/02_baseline.py for how they are used).


# %% tags=["ex08_1"]
def local_batch(x_global, process_id, num_processes, devices_per_process):
    # Mesh position k is a device of process k % num_processes and holds rows [k b, (k + 1) b).
    b = x_global.shape[0] // (num_processes * devices_per_process)
    positions = range(process_id, num_processes * devices_per_process, num_processes)
    return np.concatenate([x_global[k * b : (k + 1) * b] for k in positions])


# %% tags=["ex08_2"]
n_global = N_PROCESSES * DEVICES_PER_PROCESS
smallest = -(-100 // n_global) * n_global  # round 100 up to a multiple of the global device count
batch_answer = (smallest, smallest // N_PROCESSES)
