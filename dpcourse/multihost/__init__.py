"""Several processes, one training run: set-up, the local launcher, its worker, ports, and the split planner (lesson 08)."""
