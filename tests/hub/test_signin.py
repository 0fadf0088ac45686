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


def run(coroutine):
    """``asyncio.run`` in a thread of its own: the session's Playwright browser keeps a loop running in this one."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


@pytest.fixture()
def auth(tmp_path, monkeypatch):
    fast = signin.bcrypt.gensalt
    monkeypatch.setattr(signin.bcrypt, "gensalt", lambda: fast(4))  # the fewest rounds: the hashes, not their cost
    return signin.WorkshopAuthenticator(
        workshop_password=WORKSHOP,
        admin_password=ADMIN,
        admin_users={"instructor"},
        dbm_path=str(tmp_path / "passwords.dbm"),
    )


def sign_in(auth, name: str, password: str, workshop: str = "") -> tuple[str | None, str]:
    """(the name signed in or None, the sentence the sign-in page shows)."""
    handler = SimpleNamespace(custom_login_error="")
    got = run(auth.authenticate(handler, {"username": name, "password": password, "otp": workshop}))
    return got, handler.custom_login_error


def test_a_taken_name_is_refused_with_the_workshop_password_in_any_case_or_form(auth):
    assert sign_in(auth, "eli", "eli's own secret", WORKSHOP) == ("eli", "")
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
    assert got is None and said.startswith("Choose a password of your own for 'dana'")
    got, said = sign_in(auth, "dana", "short", WORKSHOP)
    assert got is None and "at least 8 characters" in said
    assert auth.stored_hash("dana") is None, "a refused claim keeps nothing"
    assert sign_in(auth, "dana", "dana's own secret", WORKSHOP) == ("dana", "")
    assert sign_in(auth, "dana", "dana's own secret") == ("dana", "")


def test_a_name_mixing_alphabets_is_refused_and_one_alphabet_is_not(auth):
    cyrillic_a = "d\u0430na"  # a Cyrillic а among Latin letters: looks like dana
    got, said = sign_in(auth, cyrillic_a, "own secret 1", WORKSHOP)
    assert got is None and "mixes Cyrillic and Latin letters" in said
    assert sign_in(auth, "дана", "own secret 2", WORKSHOP) == ("дана", "")
    assert sign_in(auth, "j.smith-2", "own secret 3", WORKSHOP) == ("j.smith-2", "")


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
    assert auth.forget("eli") is True and auth.forget("eli") is False


def test_the_sign_in_page_asks_for_the_workshop_password_in_a_second_field(auth):
    assert auth.request_otp is True and "Workshop password" in auth.otp_prompt
    handlers = dict(auth.get_handlers(None))
    assert handlers["/login"].__name__ == "CustomLoginHandler"  # the page that shows the sentences above
