"""The room card (hub/card.py): made from the hub's settings, escaped, and one printed page."""

from __future__ import annotations

import importlib.util
import re

import pytest
from hubprocess import ROOT

spec = importlib.util.spec_from_file_location("card", ROOT / "hub" / "card.py")
card = importlib.util.module_from_spec(spec)
spec.loader.exec_module(card)


def test_the_card_says_the_hubs_address_and_the_password_it_keeps(tmp_path):
    (tmp_path / "password").write_text("kept-password-1\n")
    found = card.settings({"HUB_DIR": str(tmp_path), "HUB_IP": "10.0.0.5", "HUB_PORT": "8443", "HUB_SSL_CERT": "c.pem"})
    assert found == {"address": "https://10.0.0.5:8443/", "password": "kept-password-1", "admin": "instructor"}
    assert card.settings({"HUB_DIR": str(tmp_path), "HUB_PASSWORD": "given-password"})["password"] == "given-password"
    page = card.render(found)
    assert "https://10.0.0.5:8443/" in page and "kept-password-1" in page
    assert "Restart Kernel and Run All Cells" in page and "workspace reset 05 --dir ~/workspace" in page


def test_no_password_yet_says_to_start_the_hub_once(tmp_path):
    with pytest.raises(card.CardError, match="start the hub once"):
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
