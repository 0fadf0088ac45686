"""tools/room_bench.py's kernel messages, load samples and arguments, without a hub (the benchmark itself runs one)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import room_bench  # noqa: E402


class FakeSocket:
    """A kernel's websocket: answers each execute_request with ``answers(msg_id)``."""

    def __init__(self, answers):
        self.answers, self.queue, self.sent = answers, [], []

    def send(self, text):
        request = json.loads(text)
        self.sent.append(request)
        self.queue += self.answers(request["header"]["msg_id"])

    def settimeout(self, seconds):
        assert seconds >= 1.0

    def recv(self):
        return json.dumps(self.queue.pop(0))


def message(kind, parent, **content):
    return {"header": {"msg_type": kind}, "parent_header": {"msg_id": parent} if parent else {}, "content": content}


def test_a_cell_s_reply_and_printed_text_come_back_and_other_cells_messages_are_skipped():
    ws = FakeSocket(
        lambda mid: [
            message("stream", "someone-else", text="not mine\n"),
            message("status", mid, execution_state="busy"),
            message("stream", mid, text="3 processes\n"),
            message("execute_reply", mid, status="ok"),
        ]
    )
    reply, printed = room_bench.execute(ws, "session", "print(3)", time.time() + 60)
    assert reply == {"status": "ok"} and printed == "3 processes\n"
    assert ws.sent[0]["content"]["code"] == "print(3)" and ws.sent[0]["channel"] == "shell"


def test_a_kernel_that_dies_mid_cell_ends_the_run_in_a_sentence_not_a_wait():
    ws = FakeSocket(
        lambda mid: [message("stream", mid, text="step 1\n"), message("status", None, execution_state="dead")]
    )
    reply, printed = room_bench.execute(ws, "session", "train()", time.time() + 60)
    assert reply["status"] == "error" and reply["ename"] == "KernelDied" and printed == "step 1\n"


def test_the_load_of_a_run_is_the_samples_taken_during_it():
    sampler = room_bench.LoadSampler()
    sampler.samples = [(1.0, 2.0), (3.0, 9.5), (5.0, 12.0), (7.0, 4.0)]
    assert sampler.between(2.0, 5.0) == [9.5, 12.0]
    assert len(sampler.between(100.0, 101.0)) == 1  # none taken: the load now


@pytest.mark.parametrize("argv", [["--learners", "0"], ["--tries", "-1"]])
def test_no_learners_or_no_tries_is_refused_before_a_hub_starts(argv, capsys):
    with pytest.raises(SystemExit) as ended:
        room_bench.main(argv)
    assert ended.value.code == 2 and "must be 1 or more" in capsys.readouterr().err
