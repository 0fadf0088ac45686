"""Exercise checkers for lessons 02 to 12: one call per exercise, feedback in a sentence or two.

Each lesson imports its module (``from dpcourse.exercises import lesson04 as check``)
and calls one checker per exercise with the learner's answer. Solutions
live in ``solutions/`` beside the course; :mod:`coursetools.solutions`
fills them into the notebooks for the CI run.
"""

from dpcourse.exercises.base import STRICT_ENV, ExerciseFailed, Feedback

__all__ = ["STRICT_ENV", "ExerciseFailed", "Feedback"]
