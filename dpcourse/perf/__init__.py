"""Lesson 09's performance tools: hardware ceilings, the roofline, the ladder of step variants, the link benchmark."""
