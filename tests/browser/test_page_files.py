"""The page files themselves (docs/web.md): nothing fetched from elsewhere, nothing written as
HTML from data. Needs no browser."""

from __future__ import annotations

from importlib.resources import files


def test_the_pages_fetch_nothing_from_elsewhere() -> None:
    """No CDN, no web fonts: every URL the pages name is the gateway's own (docs/web.md)."""
    web = files("appbridge") / "web"
    for name in ("phone.html", "phone.js", "console.html", "console.js", "common.js", "web.css"):
        text = (web / name).read_text()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, name
        assert "@import" not in text and "@font-face" not in text, name
        assert ".innerHTML" not in text, name
