"""Signing in to the workshop's hub: each learner's name bound to a password of their own, a new name claimed with the workshop password.

JupyterHub's FirstUseAuthenticator (jupyterhub-firstuseauthenticator, the
release the Zero to JupyterHub hub image bundles) keeps a bcrypt hash of
each name's password; :class:`WorkshopAuthenticator` adds to it:

- a name no one holds yet is claimed only with the workshop password, typed in
  the form's second field (JupyterHub's ``request_otp`` field); the password
  typed in the first becomes the learner's own, and may not be the workshop's;
- a name someone holds opens only with that learner's password: the workshop
  password opens no one's account, whatever the case of the name (JupyterHub
  lowers it) or the Unicode form it was typed in (normalised to NFC here);
- a new name that mixes scripts (a Cyrillic ``а`` among Latin letters) is
  refused, so that no two learners' names look alike;
- the instructor (``admin_users``) signs in with the admin password alone,
  and a learner can never claim that name.

A learner who forgot their password: the instructor deletes their user on
the admin page (JupyterHub's "Delete user"); FirstUseAuthenticator forgets
the password with it, and the learner signs in again as a new name, their
workspace kept (docs/instructor.md, "Signing in").

Used by hub/jupyterhub_config.py (`make hub`) and, mounted into the hub's
pod, by deploy/hub/config.yaml (GKE). Imports only JupyterHub, the
authenticator, bcrypt, tornado and the standard library: on GKE this runs in
the hub's image.
"""

from __future__ import annotations

import dbm
import hmac
import unicodedata

import bcrypt
from firstuseauthenticator import FirstUseAuthenticator
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
NOT_WORKSHOP = (
    "Choose a password of your own for {name!r}, not the workshop password: everyone in the room knows that one."
)
MIXED = (
    "The name {name!r} mixes {scripts} letters, which look alike: type it in one alphabet, so that no two "
    "learners' names look the same."
)


def scripts(name: str) -> set[str]:
    """The alphabets of the letters in ``name`` (``LATIN``, ``CYRILLIC``, ...; the first word of each letter's Unicode name)."""
    found = set()
    for ch in name:
        if ch.isalpha():
            found.add(unicodedata.name(ch, "UNKNOWN").split()[0])
    return found


class WorkshopAuthenticator(FirstUseAuthenticator):
    """FirstUseAuthenticator whose new names need the workshop password, and whose instructor has a password of their own."""

    workshop_password = Unicode(
        "", config=True, help="The password that claims a new name (learners type it once, in the second field)."
    )
    admin_password = Unicode("", config=True, help="The password of the admin users (the instructor).")

    @default("request_otp")
    def _ask_for_the_workshop_password(self):
        return True

    @default("otp_prompt")
    def _prompt(self):
        return "Workshop password (only the first time you sign in with a name):"

    @default("min_password_length")
    def _at_least(self):
        return 8

    def normalize_username(self, username: str) -> str:
        """JupyterHub's normalisation (lower case, ``username_map``) of the name in Unicode's composed form (NFC)."""
        return super().normalize_username(unicodedata.normalize("NFC", username))

    def stored_hash(self, name: str) -> bytes | None:
        """The bcrypt hash kept for ``name``, or None when no one holds it."""
        with dbm.open(self.dbm_path, "c", 0o600) as db:
            return db.get(name.encode("utf8"))

    async def authenticate(self, handler, data: dict) -> str | None:
        """The learner's name when its password is right, else None with the reason on the sign-in page."""
        name = self.normalize_username(data.get("username", ""))
        password, gate = data.get("password", ""), data.get("otp", "") or ""

        def refuse(message: str) -> None:
            if hasattr(handler, "custom_login_error"):  # FirstUseAuthenticator's login page shows it
                handler.custom_login_error = message
            self.log.warning("sign-in refused for %r: %s", name, message.split(":")[0])

        if not name:
            return None
        if name in self.admin_users:
            ok = bool(self.admin_password) and hmac.compare_digest(password.encode(), self.admin_password.encode())
            return name if ok else None
        stored = self.stored_hash(name)
        if stored is not None:
            if bcrypt.checkpw(password.encode("utf8"), stored):
                return name
            return refuse(TAKEN.format(name=name))
        if not self.workshop_password or not hmac.compare_digest(gate.encode(), self.workshop_password.encode()):
            return refuse(NEW_NAME.format(name=name, least=self.min_password_length))
        if len(scripts(name)) > 1:
            return refuse(MIXED.format(name=name, scripts=" and ".join(sorted(s.title() for s in scripts(name)))))
        if hmac.compare_digest(password.encode(), self.workshop_password.encode()):
            return refuse(NOT_WORKSHOP.format(name=name))
        if not self._validate_password(password):
            return refuse(NEW_NAME.format(name=name, least=self.min_password_length))
        with dbm.open(self.dbm_path, "c", 0o600) as db:
            if db.get(name.encode("utf8")) is not None:  # claimed a moment ago by another sign-in
                return refuse(TAKEN.format(name=name))
            db[name.encode("utf8")] = bcrypt.hashpw(password.encode("utf8"), bcrypt.gensalt())
        self.log.info("the name %r is claimed", name)
        return name

    def forget(self, name: str) -> bool:
        """Forget ``name``'s password (`make hub-end`, with the hub stopped); True when one was kept."""
        with dbm.open(self.dbm_path, "c", 0o600) as db:
            if db.get(name.encode("utf8")) is None:
                return False
            del db[name.encode("utf8")]
        return True
