"""The board's actions on `make hub` (coursetools/room.py): a known learner and a lesson, or refused."""

from __future__ import annotations

import pytest

from coursetools.room import BadBody, action_command, read_action


def test_board_actions_name_a_known_learner_and_a_lesson_or_are_refused(tmp_path):
    (tmp_path / "bob" / "workspace").mkdir(parents=True)
    command = action_command({"action": "catchup", "lesson": "04", "learner": "bob"}, tmp_path, "py")
    assert command == [
        "py",
        "-m",
        "coursetools",
        "workspace",
        "catchup",
        "04",
        "--dir",
        str(tmp_path / "bob" / "workspace"),
    ]
    everyone = action_command({"action": "reset", "lesson": "05_shard_map", "room": True}, tmp_path, "py")
    assert everyone[-2:] == ["--room", str(tmp_path)]
    with pytest.raises(ValueError, match="every learner"):  # * is a name like any other
        action_command({"action": "reset", "lesson": "04", "learner": "*"}, tmp_path, "py")


def test_a_learner_named_star_or_with_look_alike_characters_is_targeted_alone(tmp_path):
    for name in ("*", "zo\u00eb", "zoe\u0308", "d\u0430na", "dana"):
        (tmp_path / name / "workspace").mkdir(parents=True)
    command = action_command({"action": "reset", "lesson": "04", "learner": "*"}, tmp_path, "py")
    assert command[-2:] == ["--dir", str(tmp_path / "*" / "workspace")]
    for typed, meant in (("zo\\u00eb", "zo\u00eb"), ("zoe\\u0308", "zoe\u0308"), ("d\\u0430na", "d\u0430na")):
        command = action_command({"action": "reset", "lesson": "04", "learner": typed}, tmp_path, "py")
        assert command[-1] == str(tmp_path / meant / "workspace"), typed
    assert action_command({"action": "reset", "lesson": "04", "learner": "dana"}, tmp_path, "py")[-1].endswith(
        "/dana/workspace"
    )
    for bad, said in (
        ({"action": "rm", "lesson": "04", "learner": "bob"}, "catchup or reset"),
        ({"action": "reset", "lesson": "../x", "learner": "bob"}, "as its number"),
        ({"action": "reset", "lesson": "04", "learner": "../bob"}, "no learner"),
        ({"action": "reset", "lesson": "04", "learner": "carol"}, "no learner"),
    ):
        with pytest.raises(ValueError, match=said):
            action_command(bad, tmp_path, "py")


@pytest.mark.parametrize(
    "body",
    [b"[]", b'"catchup"', b"null", b"3", b"[" * 100_000 + b"]" * 100_000, b"{half", b"\xff\xfe", b"NaN"],
)
def test_a_board_action_whose_body_is_not_a_json_object_is_refused_in_one_sentence(body, tmp_path):
    with pytest.raises(BadBody) as caught:
        action_command(read_action(body), tmp_path, "py")
    said = str(caught.value)
    assert said.startswith("The action's body is not") and said.endswith('"learner": "bob"}.') and len(said) < 200
    with pytest.raises(BadBody, match="not a JSON object"):
        action_command(["catchup", "04", "bob"], tmp_path, "py")
    assert read_action(b"") == {} and read_action(b'{"action": "reset"}') == {"action": "reset"}
