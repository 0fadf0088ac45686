"""Lesson 10's forms beyond replicated data parallelism (:mod:`~dpcourse.sharded.forms`), its harness
(:mod:`~dpcourse.sharded.report`) and its read sentences (:mod:`~dpcourse.sharded.state_sentences`)."""
