"""Signing in to the workshop's hub: each learner's name bound to a password of their own, a new name claimed with the workshop password.

JupyterHub's FirstUseAuthenticator (jupyterhub-firstuseauthenticator, the
release the Zero to JupyterHub hub image bundles) keeps a bcrypt hash of
each name's password; :class:`WorkshopAuthenticator` adds to it:

- a name no one holds yet is claimed only with the workshop password, typed in
  the form's second field (JupyterHub's ``request_otp`` field); the password
  typed in the first becomes the learner's own;
- one rule set for every path that sets a password (the claim and
  FirstUseAuthenticator's ``/hub/auth/change-password``): at least
  ``min_password_length`` characters, never the workshop password;
- a name someone holds opens only with that learner's password: the workshop
  password opens no one's account, whatever the case of the name (JupyterHub
  lowers it) or the Unicode form it was typed in (normalised to NFC here);
- wrong passwords are counted per name and per address: past a few, each
  wrong one doubles the wait before the next try (:class:`Guesses`), said in
  one sentence; bcrypt runs in a thread, never on the hub's event loop;
- a new name is refused, with one sentence, when it holds an invisible or
  control character (Unicode categories C*: a zero-width joiner, a soft
  hyphen), mixes scripts (a Cyrillic ``а`` among Latin letters), reads like a
  taken name once folded (:func:`fold`: fullwidth or bold letters, another
  case), or is too long for a learner's folder (``homes_dir``), before
  anything is stored;
- the instructor (``admin_users``) signs in with the admin password alone,
  and a learner can never claim that name.

A learner who forgot their password: the instructor deletes their user on
the admin page (JupyterHub's "Delete user"); FirstUseAuthenticator forgets
the password with it, and the learner signs in again as a new name, their
workspace kept (docs/instructor.md, "Signing in").

Used by hub/jupyterhub_config.py (`make hub`), hub/end.py, and, mounted into
the hub's pod, by deploy/hub/config.yaml (GKE). Imports only JupyterHub, the
authenticator, bcrypt, tornado and the standard library: on GKE this runs in
the hub's image.
"""

from __future__ import annotations

import asyncio
import dbm
import hmac
import math
import os
import time
import unicodedata
from pathlib import Path

import bcrypt
from firstuseauthenticator import FirstUseAuthenticator
from firstuseauthenticator.firstuseauthenticator import ResetPasswordHandler
from tornado import web
from traitlets import Unicode, default

TAKEN = (
    "The name {name!r} is taken, and this is not its password. If it is yours, type the password you chose when "
    "you first signed in (the workshop password opens no one's account); if you forgot it, ask the instructor. "
    "Otherwise choose another name."
)
NEW_NAME = (
    "{name!r} is a new name: to claim it, type the workshop password in the second field and a password of your "
    "own (at least {least} characters) in the first. You sign in with your own password from then on."
)
SHORT = "Choose a password of at least {least} characters."
NOT_WORKSHOP = "Choose a password of your own, not the workshop password: everyone in the room knows that one."
MIXED = (
    "The name {name!r} mixes {scripts} letters, which look alike: type it in one alphabet, so that no two "
    "learners' names look the same."
)
HIDDEN = (
    "The name {name!r} holds an invisible or control character ({points}): type it again with visible characters only."
)
LOOKS_LIKE = (
    "The name {name!r} reads like the taken name {taken!r} (the same letters in another form or case): "
    "choose a name of your own."
)
WAIT = (
    "Too many wrong passwords {whom}: wait {seconds} s before the next try (each wrong one doubles the wait); "
    "if you forgot your password, ask the instructor."
)
# The deepest path the workspace writes below a learner's folder, with room to spare:
# workspace/old/<timestamp>-N/updates/.NN_lesson.ipynb.tmp-<pid> (coursetools/workspace.py).
WORKSPACE_DEPTH_BYTES = 160


def fold(name: str) -> str:
    """``name`` as names are compared for look-alikes: Unicode's NFKC_Casefold (fullwidth, bold, case all one)."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())


def scripts(name: str) -> set[str]:
    """The alphabets of the letters in ``name`` (``LATIN``, ``CYRILLIC``, ...; the first word of each letter's Unicode name)."""
    return {unicodedata.name(ch, "UNKNOWN").split()[0] for ch in name if ch.isalpha()}


def hidden(name: str) -> list[str]:
    """The characters of ``name`` in Unicode's categories C* (control, format, unassigned...), as ``U+200D``."""
    return [f"U+{ord(ch):04X}" for ch in name if unicodedata.category(ch).startswith("C")]


def folder_problem(name: str, homes: Path) -> str | None:
    """Why no folder ``homes/<name>`` could hold the learner ``name`` here (one sentence), or None.

    The file system's own limits (``os.pathconf``: ``PC_NAME_MAX``, 255 bytes
    on ext4, and ``PC_PATH_MAX``) decide, so a name is refused at sign-in
    rather than failing at the spawn with ``File name too long``.
    """
    existing = next(p for p in (homes, *homes.parents) if p.exists())
    try:
        name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    size, base = len(os.fsencode(name)), len(os.fsencode(str(homes))) + 1
    shown = name if len(name) <= 24 else f"{name[:16]}... ({len(name)} characters)"
    if size > name_max:
        return (
            f"The name {shown!r} is too long for this hub: each learner gets a folder named after them, and this "
            f"machine's file system takes folder names of at most {name_max} bytes. Sign in with a shorter name."
        )
    if base + size + WORKSPACE_DEPTH_BYTES > path_max:
        return (
            f"The name {shown!r} is too long for this hub: the learner's folder would lie deeper than this "
            f"machine's path limit ({path_max} bytes). Sign in with a name of at most "
            f"{max(path_max - base - WORKSPACE_DEPTH_BYTES, 0)} bytes."
        )
    return None


class Guesses:
    """Wrong passwords per key (a name, an address): past ``free`` of them, each doubles the wait before the next try.

    The wait runs from the last wrong one, from 1 s up to ``longest_s``; a key
    with no wrong password for ``forget_s`` starts again from nothing, and a right
    password clears its name's count (never an address's).
    """

    def __init__(self, free: int, longest_s: float, forget_s: float = 900.0, clock=time.monotonic) -> None:
        self.free, self.longest_s, self.forget_s, self.clock = free, longest_s, forget_s, clock
        self.wrong_at: dict[str, tuple[int, float]] = {}  # key -> (wrong passwords, when the last was)

    def wait_s(self, key: str) -> float:
        """Seconds before ``key`` may try again (0: now)."""
        count, last = self.wrong_at.get(key, (0, 0.0))
        if self.clock() - last > self.forget_s:
            self.wrong_at.pop(key, None)
            return 0.0
        if count < self.free:
            return 0.0
        return max(0.0, min(2.0 ** (count - self.free), self.longest_s) - (self.clock() - last))

    def wrong(self, key: str) -> None:
        self.wait_s(key)  # forgets an old count first
        self.wrong_at[key] = (self.wrong_at.get(key, (0, 0.0))[0] + 1, self.clock())

    def right(self, key: str) -> None:
        self.wrong_at.pop(key, None)


async def off_the_loop(function, *args):
    """``function(*args)`` in the default thread pool: bcrypt takes tenths of a second, the hub's loop none."""
    return await asyncio.get_running_loop().run_in_executor(None, function, *args)


class ChangePasswordHandler(ResetPasswordHandler):
    """FirstUseAuthenticator's change-password page, with :meth:`WorkshopAuthenticator.reset_password` off the loop."""

    @web.authenticated
    async def post(self):
        self._register_template_path()
        said = await off_the_loop(
            self.authenticator.reset_password, self.current_user.name, self.get_body_argument("password", strip=False)
        )
        page = await self.render_template(
            "reset.html", result=True, alert="success" if "success" in said else "danger", result_message=said
        )
        self.finish(page)


class WorkshopAuthenticator(FirstUseAuthenticator):
    """FirstUseAuthenticator whose new names need the workshop password, and whose instructor has a password of their own."""

    workshop_password = Unicode(
        "", config=True, help="The password that claims a new name (learners type it once, in the second field)."
    )
    admin_password = Unicode("", config=True, help="The password of the admin users (the instructor).")
    homes_dir = Unicode(
        "",
        config=True,
        help="The folder of the learners' homes (`make hub`): a name no folder there can hold is refused.",
    )

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # A room behind one address (venue Wi-Fi, NAT) shares the address's free wrong passwords.
        self.guesses = {"name": Guesses(free=3, longest_s=300.0), "address": Guesses(free=20, longest_s=60.0)}

    @default("request_otp")
    def _ask_for_the_workshop_password(self):
        return True

    @default("otp_prompt")
    def _prompt(self):
        return "Workshop password (only the first time you sign in with a name):"

    @default("min_password_length")
    def _at_least(self):
        return 8

    def get_handlers(self, app):
        return [
            (path, ChangePasswordHandler if path.endswith("change-password") else h)
            for path, h in super().get_handlers(app)
        ]

    def normalize_username(self, username: str) -> str:
        """JupyterHub's normalisation (lower case, ``username_map``) of the name in Unicode's composed form (NFC)."""
        return super().normalize_username(unicodedata.normalize("NFC", username))

    def stored_hash(self, name: str) -> bytes | None:
        """The bcrypt hash kept for ``name``, or None when no one holds it."""
        with dbm.open(self.dbm_path, "c", 0o600) as db:
            return db.get(name.encode("utf8"))

    def taken_like(self, name: str) -> str | None:
        """A taken name (or an admin's) other than ``name`` that folds onto the same letters, or None."""
        with dbm.open(self.dbm_path, "c", 0o600) as db:
            taken = [key.decode("utf8") for key in db.keys()]  # noqa: SIM118 - dbm.gnu cannot be iterated
        return next((t for t in (*taken, *self.admin_users) if t != name and fold(t) == fold(name)), None)

    def password_problem(self, password: str) -> str | None:
        """Why ``password`` may not be a learner's (one sentence), or None: every path that sets one asks this."""
        if not self._validate_password(password):
            return SHORT.format(least=self.min_password_length)
        if self.workshop_password and hmac.compare_digest(password.encode(), self.workshop_password.encode()):
            return NOT_WORKSHOP
        return None

    def reset_password(self, username: str, new_password: str) -> str:
        """The change-password page's new password, stored when :meth:`password_problem` has nothing against it."""
        return self.password_problem(new_password) or super().reset_password(username, new_password)

    async def authenticate(self, handler, data: dict) -> str | None:
        """The learner's name when its password is right, else None with the reason on the sign-in page."""
        name = self.normalize_username(data.get("username") or "")
        password, gate = data.get("password") or "", data.get("otp") or ""
        address = getattr(getattr(handler, "request", None), "remote_ip", "") or ""
        keys = {"name": name, "address": address}

        def refuse(message: str) -> None:
            if hasattr(handler, "custom_login_error"):  # FirstUseAuthenticator's login page shows it
                handler.custom_login_error = message
            self.log.warning("sign-in refused for %r from %s: %s", name, address, message.split(":")[0])

        def wrong(message: str, *kinds: str) -> None:
            for kind in kinds:
                self.guesses[kind].wrong(keys[kind])
            return refuse(message)

        if not name:
            return None
        for kind, whom in (("name", f"for {name!r}"), ("address", "from this address")):
            wait = self.guesses[kind].wait_s(keys[kind])
            if wait > 0:
                return refuse(WAIT.format(whom=whom, seconds=math.ceil(wait)))
        if name in self.admin_users:
            ok = bool(self.admin_password) and hmac.compare_digest(password.encode(), self.admin_password.encode())
            return name if ok else wrong("Wrong password for the instructor's name.", "name", "address")
        stored = self.stored_hash(name)
        if stored is not None:
            if await off_the_loop(bcrypt.checkpw, password.encode("utf8"), stored):
                self.guesses["name"].right(name)
                return name
            return wrong(TAKEN.format(name=name), "name", "address")
        if not self.workshop_password or not hmac.compare_digest(gate.encode(), self.workshop_password.encode()):
            return wrong(NEW_NAME.format(name=name, least=self.min_password_length), "address")
        problem = (
            (hidden(name) and HIDDEN.format(name=name, points=" ".join(hidden(name))))
            or (
                len(scripts(name)) > 1
                and MIXED.format(name=name, scripts=" and ".join(sorted(s.title() for s in scripts(name))))
            )
            or (self.homes_dir and folder_problem(name, Path(self.homes_dir)))
            or ((taken := self.taken_like(name)) and LOOKS_LIKE.format(name=name, taken=taken))
            or self.password_problem(password)
        )
        if problem:
            return refuse(problem)
        hashed = await off_the_loop(bcrypt.hashpw, password.encode("utf8"), bcrypt.gensalt())
        with dbm.open(self.dbm_path, "c", 0o600) as db:
            if db.get(name.encode("utf8")) is not None:  # claimed a moment ago by another sign-in
                return refuse(TAKEN.format(name=name))
            db[name.encode("utf8")] = hashed
        self.log.info("the name %r is claimed", name)
        return name
