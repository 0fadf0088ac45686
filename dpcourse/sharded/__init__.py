"""Lesson 10's forms beyond replicated data parallelism (:mod:`~dpcourse.sharded.forms`) and its harness
(:mod:`~dpcourse.sharded.report`): tables, checks, records and the sentence that reads its bytes table."""
