"""Lesson 12's large-batch tools: steps to a target, the gradient noise scale, the steps-examples trade-off."""
