"""Compiling the course's steps for devices you do not have, GPUs and TPU slices (lessons 04, 05, 09, 10, ``make placement``)."""
