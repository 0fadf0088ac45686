"""hub/signin.py without a hub: a name is claimed once with the workshop password, then opens only with its own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import unicodedata
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hub"))
import signin  # noqa: E402 - hub/signin.py

WORKSHOP = "room-password-1"
ADMIN = "instructor-password-" * 2
GENSALT = signin.bcrypt.gensalt


def run(coroutine):
    """``asyncio.run`` in a thread of its own: the session's Playwright browser keeps a loop running in this one."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


@pytest.fixture()
def auth(tmp_path, monkeypatch):
    monkeypatch.setattr(signin.bcrypt, "gensalt", lambda: GENSALT(4))  # the fewest rounds: the hashes, not their cost
    return signin.WorkshopAuthenticator(
        workshop_password=WORKSHOP,
        admin_password=ADMIN,
        admin_users={"instructor"},
        dbm_path=str(tmp_path / "passwords.dbm"),
    )


def sign_in(auth, name: str, password: str, workshop: str = "", address="10.0.0.1") -> tuple[str | None, str]:
    """(the name signed in or None, the sentence the sign-in page shows)."""
    handler = SimpleNamespace(custom_login_error="", request=SimpleNamespace(remote_ip=address))
    got = run(auth.authenticate(handler, {"username": name, "password": password, "otp": workshop}))
    return got, handler.custom_login_error


def test_a_taken_name_is_refused_with_the_workshop_password_in_any_case_or_form(auth):
    assert sign_in(auth, "eli", "eli's own secret", WORKSHOP) == ("eli", "")
    auth.guesses["name"].free = 100  # the limit on wrong passwords: its own test below
    # The second browser: the taken name (and its case and Unicode variants) with the workshop password.
    for name in ("eli", "Eli", "ELI"):
        for password, workshop in ((WORKSHOP, ""), (WORKSHOP, WORKSHOP), ("", WORKSHOP)):
            got, said = sign_in(auth, name, password, workshop)
            assert got is None and said.startswith("The name 'eli' is taken") and "ask the instructor" in said
    assert sign_in(auth, "Eli", "eli's own secret") == ("eli", "")  # eli herself, the workshop field empty
    composed = unicodedata.normalize("NFC", "zoë")
    assert sign_in(auth, composed, "zoe's own secret", WORKSHOP) == (composed, "")
    got, said = sign_in(auth, unicodedata.normalize("NFD", "Zoë"), WORKSHOP, WORKSHOP)
    assert got is None and "is taken" in said
    assert sign_in(auth, unicodedata.normalize("NFD", "zoë"), "zoe's own secret") == (composed, "")


def test_a_new_name_needs_the_workshop_password_and_a_password_of_its_own(auth):
    got, said = sign_in(auth, "dana", "dana's own secret")
    assert got is None and said.startswith("'dana' is a new name") and "workshop password in the second" in said
    got, said = sign_in(auth, "dana", "dana's own secret", "a wrong guess")
    assert got is None and "new name" in said
    got, said = sign_in(auth, "dana", WORKSHOP, WORKSHOP)
    assert got is None and said.startswith("Choose a password of your own, not the workshop password")
    got, said = sign_in(auth, "dana", "short", WORKSHOP)
    assert got is None and "at least 8 characters" in said
    assert auth.stored_hash("dana") is None, "a refused claim keeps nothing"
    assert sign_in(auth, "dana", "dana's own secret", WORKSHOP) == ("dana", "")
    assert sign_in(auth, "dana", "dana's own secret") == ("dana", "")
    # The change-password page holds the same rules (the real hub's page: tests/hub/test_hub_room.py).
    assert auth.reset_password("dana", WORKSHOP).startswith("Choose a password of your own")
    assert "at least 8" in auth.reset_password("dana", "short")
    assert sign_in(auth, "dana", "dana's own secret") == ("dana", "")
    assert "success" in auth.reset_password("dana", "dana's new secret")
    assert sign_in(auth, "dana", "dana's new secret") == ("dana", "")


@pytest.mark.parametrize(
    "name, said",
    [
        ("d\u0430na", "mixes Cyrillic and Latin letters"),  # a Cyrillic а among Latin letters: looks like dana
        ("eli\u200d", "invisible or control character (U+200D)"),  # zero-width joiner
        ("e\u00adli", "(U+00AD)"),  # soft hyphen
        ("eli\u200b", "(U+200B)"),  # zero-width space
        ("a$(id)`id`'\n", "(U+000A)"),  # a newline
        ("\uff45\uff4c\uff49", "reads like the taken name 'eli'"),  # fullwidth
        ("\U0001d41e\U0001d425\U0001d422", "reads like the taken name 'eli'"),  # mathematical bold
        ("a" * 300, "too long for this hub"),
    ],
)
def test_a_new_name_that_looks_like_another_or_fits_no_folder_is_refused_before_anything_is_kept(
    auth, tmp_path, name, said
):
    auth.homes_dir = str(tmp_path / "users")
    assert sign_in(auth, "eli", "eli's own secret", WORKSHOP) == ("eli", "")
    got, told = sign_in(auth, name, "own secret 1", WORKSHOP)
    assert got is None and said in told
    assert auth.stored_hash(auth.normalize_username(name)) is None
    for plain in ("дана", "j.smith-2", "a$(id)`id`'\"q"):  # one alphabet, and what a shell reads specially
        assert sign_in(auth, plain, "own secret 2", WORKSHOP) == (plain, "")


def test_wrong_passwords_wait_longer_and_longer_per_name_and_per_address(auth):
    now = [0.0]
    for guesses in auth.guesses.values():
        guesses.clock = lambda: now[0]
    assert sign_in(auth, "eli", "eli's own secret", WORKSHOP)[0] == "eli"
    for _ in range(3):  # free
        assert "is taken" in sign_in(auth, "eli", "a guess 1234", address="10.0.0.2")[1]
    for wait in (1, 2, 4):
        got, said = sign_in(auth, "eli", "eli's own secret", address="10.0.0.3")  # even the right one waits
        assert got is None and said.startswith(f"Too many wrong passwords for 'eli': wait {wait} s")
        now[0] += wait
        assert "is taken" in sign_in(auth, "eli", "a guess 1234", address="10.0.0.2")[1]
    now[0] += 8
    assert sign_in(auth, "eli", "eli's own secret") == ("eli", "")  # and the count starts again
    assert "is taken" in sign_in(auth, "eli", "a guess 1234")[1]
    for n in range(14):  # workshop-password guesses from that address: 20 free, 6 spent above
        assert "is a new name" in sign_in(auth, f"n{n}", "own secret 1", "guess", address="10.0.0.2")[1]
    got, said = sign_in(auth, "zed", "own secret 1", WORKSHOP, address="10.0.0.2")
    assert got is None and said.startswith("Too many wrong passwords from this address: wait 1 s")
    assert sign_in(auth, "zed", "own secret 1", WORKSHOP, address="10.0.0.4") == ("zed", "")


def test_a_bcrypt_check_never_holds_the_hubs_event_loop(auth):
    with signin.dbm.open(auth.dbm_path, "c") as db:  # a real cost (12 rounds: tenths of a second)
        db[b"eli"] = signin.bcrypt.hashpw(b"eli's own secret", GENSALT(12))

    async def ticks_during_a_check():
        ticks = []

        async def tick():
            while True:
                await asyncio.sleep(0.005)
                ticks.append(1)

        ticker = asyncio.create_task(tick())
        got = await auth.authenticate(SimpleNamespace(), {"username": "eli", "password": "eli's own secret"})
        ticker.cancel()
        return got, len(ticks)

    got, ticks = run(ticks_during_a_check())
    assert got == "eli" and ticks >= 5, f"the loop ticked {ticks} times during the check"


def test_the_instructor_signs_in_with_the_admin_password_alone_and_no_learner_takes_the_name(auth):
    assert sign_in(auth, "instructor", ADMIN) == ("instructor", "")
    assert sign_in(auth, "Instructor", WORKSHOP, WORKSHOP)[0] is None
    assert sign_in(auth, "instructor", "a password of mine", WORKSHOP)[0] is None
    assert auth.stored_hash("instructor") is None


def test_a_forgotten_password_is_forgotten_with_the_user_and_the_name_claimed_again(auth):
    assert sign_in(auth, "eli", "eli's own secret", WORKSHOP)[0] == "eli"
    auth.delete_user(SimpleNamespace(name="eli"))  # the admin page's "Delete user"
    assert sign_in(auth, "eli", "eli's new secret", WORKSHOP) == ("eli", "")
    assert sign_in(auth, "eli", "eli's own secret")[0] is None


def test_the_sign_in_page_asks_for_the_workshop_password_in_a_second_field(auth):
    assert auth.request_otp is True and "Workshop password" in auth.otp_prompt
    handlers = dict(auth.get_handlers(None))
    assert handlers["/login"].__name__ == "CustomLoginHandler"  # the page that shows the sentences above
    assert handlers["/auth/change-password"] is signin.ChangePasswordHandler
