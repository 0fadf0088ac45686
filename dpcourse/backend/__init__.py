"""What the JAX backend runs on: XLA_FLAGS checks, GPU facts from nvidia-smi, the collective probe (lessons 01 and 09), a learner's global mesh (mesh_guard)."""
