"""Compiling the course's steps for NVIDIA GPUs on a machine without one (lessons 04, 05, 09, 10 and ``make placement``)."""
