"""Put a data-parallel workload on the devices, as notebook 04 teaches it.

Notebook 04 writes these placements out line by line; notebooks 05 to 07
reuse them from here so that each can run on its own:

- parameters and optimizer state replicated, ``P()``;
- stacked batches ``[n_batches, global_batch, 784]`` sharded
  ``P(None, 'data', None)``, labels ``[n_batches, global_batch]`` sharded
  ``P(None, 'data')``; one step's batch is ``x[i]``, sharded ``P('data', None)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dpcourse.config import Config
from dpcourse.data import Dataset, stacked_batches


@dataclass
class Placed:
    """A workload on its device(s).

    Attributes:
        params, opt_state: on the device(s), replicated over the mesh.
        batches: ``cfg.n_batches`` pairs ``(x [global_batch, 784], y [global_batch])``.
        x_host, y_host: the same batches on the host, stacked
            ``[n_batches, global_batch, 784]`` and ``[n_batches, global_batch]``.
    """

    params: Any
    opt_state: Any
    batches: list
    x_host: np.ndarray
    y_host: np.ndarray


def place_data_parallel(
    cfg: Config,
    dataset: Dataset,
    mesh: Mesh,
    optimizer: optax.GradientTransformation,
    init_params: dict,
    global_batch: int,
    axis: str = "data",
) -> Placed:
    """Replicate ``init_params`` over ``mesh`` and shard ``cfg.n_batches`` global batches over ``axis``.

    Raises:
        ValueError: ``global_batch`` does not divide by the size of ``axis``
            (from ``jax.device_put``; check first with
            :func:`dpcourse.train.check_global_batch` for a clearer message).
    """
    params = jax.device_put(init_params, NamedSharding(mesh, P()))
    opt_state = optimizer.init(params)
    x_host, y_host = stacked_batches(dataset, cfg.n_batches, global_batch)
    x_stack = jax.device_put(x_host, NamedSharding(mesh, P(None, axis, None)))
    y_stack = jax.device_put(y_host, NamedSharding(mesh, P(None, axis)))
    batches = [(x_stack[i], y_stack[i]) for i in range(cfg.n_batches)]
    return Placed(params, opt_state, batches, x_host, y_host)


def place_single_device(
    cfg: Config, dataset: Dataset, device, optimizer: optax.GradientTransformation, init_params: dict, global_batch: int
) -> Placed:
    """The same workload on one device (the reference of the equivalence checks).

    Runs outside any mesh set with ``jax.set_mesh`` (:func:`dpcourse.devices.outside_mesh`).
    """
    from dpcourse.devices import outside_mesh

    with outside_mesh():
        params = jax.device_put(init_params, device)
        opt_state = optimizer.init(params)
        x_host, y_host = stacked_batches(dataset, cfg.n_batches, global_batch)
        batches = [(jax.device_put(x_host[i], device), jax.device_put(y_host[i], device)) for i in range(cfg.n_batches)]
    return Placed(params, opt_state, batches, x_host, y_host)
