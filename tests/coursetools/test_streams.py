"""Tests of coursetools.streams: a saved stream as a terminal leaves it (a tqdm bar in its final state)."""

from __future__ import annotations

import nbformat

from coursetools import streams


def test_a_progress_bar_is_published_in_its_final_state_only():
    bar = "ladder:   0%|          | 0/6\rladder:  50%|#####     | 3/6\rladder: 100%|##########| 6/6\n"
    assert streams.final_text(bar) == "ladder: 100%|##########| 6/6\n"
    assert streams.final_text("plain\nlines\n") == "plain\nlines\n"
    assert streams.final_text("windows line\r\nnext\r\n") == "windows line\nnext\n"


def test_consecutive_outputs_of_one_stream_merge_and_another_stream_stays_apart():
    out = [nbformat.v4.new_output("stream", name="stderr", text=t) for t in ("\ra 1/2", "\ra 2/2", "\n")]
    out.append(nbformat.v4.new_output("stream", name="stdout", text="done\n"))
    merged = streams.merged_streams(out)
    assert [(o["name"], o["text"]) for o in merged] == [("stderr", "a 2/2\n"), ("stdout", "done\n")]


def test_the_build_machines_folders_are_named_in_words():
    folders = {"/tmp": "$TMPDIR", "/work/wt": "<the course's folder>", "/work/wt/results/cpu": "<the run's folder>"}
    text = "Could not finish the save in /tmp/dpcourse-checkpoints-x1y2/replicated; see /work/wt/results/cpu/x.json"
    said = streams.without_machine_paths(text, folders)
    assert said == (
        "Could not finish the save in $TMPDIR/dpcourse-checkpoints-x1y2/replicated; see <the run's folder>/x.json"
    )
    assert streams.without_machine_paths("a / b", {"/": "root"}) == "a / b"
