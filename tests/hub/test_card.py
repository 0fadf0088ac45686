"""The room card (hub/card.py): made from what the running hub wrote, escaped, and one printed page."""

from __future__ import annotations

import importlib.util
import re

import pytest
from hubprocess import ROOT

spec = importlib.util.spec_from_file_location("card", ROOT / "hub" / "card.py")
card = importlib.util.module_from_spec(spec)
spec.loader.exec_module(card)


def kept(folder, address: str, password: str = "kept-password-1"):
    (folder / "address").write_text(address + "\n")
    (folder / "password").write_text(password + "\n")


def test_the_card_says_the_address_the_hub_wrote_whatever_this_shell_sets(tmp_path):
    kept(tmp_path, "https://room.example.org:8443/")
    # Settings of this shell that differ from the hub's own are not read again.
    shell = {"HUB_DIR": str(tmp_path), "HUB_PORT": "9999", "HUB_IP": "0.0.0.0", "HUB_PASSWORD": "other-password"}
    found = card.settings(shell)
    assert found == {"address": "https://room.example.org:8443/", "password": "kept-password-1", "admin": "instructor"}
    page = card.render(found)
    assert "https://room.example.org:8443/" in page and "kept-password-1" in page
    assert "Restart Kernel and Run All Cells" in page and "workspace reset 05 --dir ~/workspace" in page


def test_an_address_only_the_hubs_machine_opens_asks_for_hub_public_url(tmp_path):
    for address in ("http://127.0.0.1:8000/", "http://localhost:8000/", "http://[::1]:8000/"):
        kept(tmp_path, address)
        with pytest.raises(card.CardError, match="HUB_PUBLIC_URL"):
            card.settings({"HUB_DIR": str(tmp_path)})


def test_no_hub_started_yet_says_to_start_it(tmp_path):
    with pytest.raises(card.CardError, match=r"start the hub \(make hub\)"):
        card.settings({"HUB_DIR": str(tmp_path)})


def test_a_password_with_markup_is_shown_as_typed():
    page = card.render({"address": "http://127.0.0.1:8000/", "password": "<b>&x", "admin": "instructor"})
    assert "&lt;b&gt;&amp;x" in page and "<b>&x" not in page


def test_the_card_prints_on_one_page(browser, tmp_path):
    page = browser.new_page()
    try:
        page.set_content(card.render({"address": "https://workshop.example.org/", "password": "x" * 16, "admin": "i"}))
        pdf = page.pdf(format="A4")
        pages = len(re.findall(rb"/Type\s*/Page[^s]", pdf))
        (ROOT / "results" / "hub").mkdir(parents=True, exist_ok=True)
        (ROOT / "results" / "hub" / "room-card.pdf").write_bytes(pdf)
        assert pages == 1, f"the card takes {pages} pages"
    finally:
        page.close()
