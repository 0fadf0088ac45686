# Solutions to the exercises of notebooks/08_multihost.py (see solutions/02_baseline.py for how they are used).


# %% tags=["ex08_1"]
def local_batch(x_global, process_id, num_processes, devices_per_process):
    # Devices are in process order along 'data': each process holds one contiguous block.
    rows = x_global.shape[0] // num_processes
    return x_global[process_id * rows : (process_id + 1) * rows]


# %% tags=["ex08_2"]
n_global = N_PROCESSES * DEVICES_PER_PROCESS
smallest = -(-100 // n_global) * n_global  # round 100 up to a multiple of the global device count
batch_answer = (smallest, smallest // N_PROCESSES)
