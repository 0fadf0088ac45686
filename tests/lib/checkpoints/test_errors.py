"""dpcourse.checkpoints.errors: an operating system's error in one sentence, lasting or not."""

import errno

from dpcourse.checkpoints import errors


def test_a_tensorstore_error_is_read_for_its_operating_system_code():
    message = errors.explain(ValueError("Error writing 'w/0.0': [os_error_code='28'] No space"), "save step 4")
    assert message.startswith("Could not save step 4: no room left")


def test_an_error_of_unknown_cause_is_not_lasting_and_a_known_one_is():
    assert errors.as_error(OSError(errno.ENOSPC, "full"), "save step 1 to d").lasting
    assert errors.as_error(OSError(errno.EROFS, "ro"), "save step 1 to d").lasting
    unknown = errors.as_error(RuntimeError("DEADLINE_EXCEEDED: barrier timed out"), "finish the save in d")
    assert not unknown.lasting and str(unknown) == (
        "Could not finish the save in d: RuntimeError: DEADLINE_EXCEEDED: barrier timed out"
    )
    gone = errors.as_error(FileNotFoundError(errno.ENOENT, "no such file", "/d/4.orbax-checkpoint-tmp"), "save")
    assert "/d/4.orbax-checkpoint-tmp does not exist any more" in str(gone)
