"""Lesson 11's checkpoints: saving and restoring the resumable state with Orbax, and resuming a run in a fresh process."""
