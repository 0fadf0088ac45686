"""Helpers for the course "Data-parallel training in JAX, from one device to many".

The package holds the plumbing that would distract from the lessons (device
setup, data download, benchmark timing, the cost model, tables and plots,
the results recorder). The JAX calls each lesson is about stay visible in
the notebooks under ``notebooks/``.

Importing ``dpcourse`` never starts a JAX backend, so a notebook can import
it before :func:`dpcourse.devices.setup_devices` configures the devices.
"""

__version__ = "0.1.0"
