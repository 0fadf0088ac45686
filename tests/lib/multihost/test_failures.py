"""dpcourse.multihost.failures: the launcher headlines the process that said its own cause, not one that failed because of it."""

from __future__ import annotations

from dpcourse.multihost import failures

SAID = "[process 0/2] resumed from step 2\n[process 0] error: Could not save step 4 to /c: no room left (...).\n"
GLOO = (
    "Traceback (most recent call last):\n  ...\njaxlib.xla_extension.XlaRuntimeError: INTERNAL: "
    "[external/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40151\n"
)
NOTICE = "[Gloo] Rank 1 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7\n"


def test_the_process_that_said_its_cause_is_the_headline_even_when_its_partner_exited_first():
    """The issue's example: the launcher headlined process 1's Gloo traceback, a consequence of process 0's error."""
    texts = {0: ("", NOTICE + SAID), 1: ("", NOTICE + GLOO)}
    assert failures.first_cause((1, 1), {0: 78, 1: 1}, texts) == (0, 78)
    assert failures.first_cause((0, 78), {0: 78, 1: 1}, texts) == (0, 78)


def test_a_crash_is_the_headline_over_the_connection_errors_it_caused():
    texts = {0: ("", NOTICE + GLOO), 1: ("", NOTICE + "Segmentation fault\n"), 2: ("", GLOO)}
    assert failures.first_cause((0, 1), {0: 1, 1: -11, 2: 1}, texts) == (1, -11)  # SIGSEGV


def test_without_a_better_cause_the_first_failure_seen_stays_the_headline():
    texts = {0: ("", NOTICE + GLOO), 1: ("", NOTICE + GLOO)}
    assert failures.first_cause((1, 1), {0: 1, 1: 1}, texts) == (1, 1)
    texts = {0: ("", "ValueError: x\n"), 1: ("", "KeyError: y\n")}
    assert failures.first_cause((1, 1), {0: 1, 1: 1}, texts) == (1, 1)


def test_a_process_ended_by_the_launcher_is_never_the_headline():
    texts = {0: ("", NOTICE + GLOO), 1: ("", ""), 2: ("", "")}
    assert failures.first_cause((0, 1), {0: 1, 1: -15, 2: -9}, texts) == (0, 1)  # the launcher's SIGTERM, SIGKILL


def test_a_busy_machine_is_said_with_its_load_and_that_a_re_run_will_do(monkeypatch):
    monkeypatch.setattr(failures.os, "getloadavg", lambda: (9.3, 8.0, 5.0))
    monkeypatch.setattr(failures.os, "cpu_count", lambda: 2)
    assert failures.load_factor() == failures.MAX_LOAD_FACTOR  # 4.65 per core, capped
    said = failures.too_busy_message(41.2, 1, 3)
    assert said == (
        "The machine was too busy to start the run: after 41 s only 1 of 3 processes had started Python and "
        "imported JAX (load average 9.3 on 2 cores); nothing in the run is wrong, and a re-run will do once the "
        "machine is quieter (or with fewer processes)."
    )
    assert (
        failures.busy_note()
        == " The machine is busy (load average 9.3 on 2 cores): a re-run when it is quieter will do."
    )
    monkeypatch.setattr(failures.os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    assert failures.load_factor() == 1.0 and failures.busy_note() == ""
