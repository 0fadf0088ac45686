"""The learner's library for the course "Data-parallel training in JAX, from one device to many".

It holds what the lessons reuse (device set-up, data, the model and its training
step, benchmark timing, the cost model, tables and plots, the results
recorder, the exercise checkers); the JAX calls each lesson is about stay in
the lesson's own cells. Topic sub-packages hold what only some lessons use:
``backend`` (XLA flags, GPU facts, the collective probe), ``compiled``
(reading a compiled program), ``perf`` (ceilings, roofline, the ladder),
``multihost`` (several processes), ``cross_compile`` (compiling for GPUs and
TPUs you do not have), ``sharded`` (lesson 10's forms) and ``exercises`` (the checkers).

Importing ``dpcourse`` or any of its sub-packages never starts a JAX backend,
so a notebook can import it before :func:`dpcourse.devices.setup_devices`
configures the devices.
"""

__version__ = "0.3.0"
