"""What the whole-lesson variants change in each process that starts: packages made uninstalled, a stand-in accelerator.

On ``PYTHONPATH``, Python imports this file at start-up (``site``), so a
notebook kernel started by the runner gets it too.

``DPCOURSE_BLOCK_IMPORTS`` names top-level packages to make look
uninstalled: the path finder answers "not found" for those names, as if
their folders were absent: ``importlib.util.find_spec("rich")`` is None and
``import rich`` raises ``ModuleNotFoundError``, which is what a learner
without the package meets.

``DPCOURSE_STAND_IN_ACCELERATOR=1`` gives the process the device layout of a
one-GPU or one-TPU host on a machine with only a CPU: a second PJRT client
with one device, registered as a JAX backend of higher priority than the CPU
(the TPU's own registration has priority 300, jax/_src/xla_bridge.py, JAX
0.10.2), becomes the default backend. ``jax.devices()`` is then its one
device, ``jax.devices("cpu")`` the simulated CPU devices of the other client,
and an array made without a device lands on the stand-in's device, outside
the lesson's devices, as it lands on the chip there. It computes as a CPU
does, so it shows where arrays go, not the chip's numerics. A process started
with ``JAX_PLATFORMS=cpu`` (the course's worker processes) never starts it.
"""

import importlib.machinery
import os

_BLOCKED = {name.strip() for name in os.environ.get("DPCOURSE_BLOCK_IMPORTS", "").split(",") if name.strip()}

if _BLOCKED:
    _find_spec = importlib.machinery.PathFinder.find_spec

    def _blocking_find_spec(fullname, path=None, target=None):
        if fullname.partition(".")[0] in _BLOCKED:
            return None
        return _find_spec(fullname, path, target)

    importlib.machinery.PathFinder.find_spec = staticmethod(_blocking_find_spec)

if os.environ.get("DPCOURSE_STAND_IN_ACCELERATOR") == "1":
    try:
        from jax._src import xla_bridge  # starts no backend
        from jaxlib import xla_client
    except ImportError:  # a Python without JAX (a tool the test starts): nothing to stand in for
        xla_bridge = None
    if xla_bridge is not None:
        xla_bridge.register_backend_factory(
            "standin", lambda: xla_client.make_cpu_client(num_devices=1), priority=300, fail_quietly=False
        )
