"""The page routes (http/routes_web.py; docs/operations.md, "The console and the softphone"):
the guarded pages with their security headers, and only the allowed files of the page folder,
pointed here at tests/web_pages."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.testclient import TestClient

from appbridge.http import routes_web
from appbridge.http.errors import http_error
from appbridge.http.routes_web import web_routes
from tests.unit.test_web_auth import TOKEN, FakeGateway

PAGES = Path(__file__).resolve().parents[2] / "web_pages"


@pytest.fixture
def pages(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(routes_web, "WEB_DIR", PAGES)
    return PAGES


def client(gw: FakeGateway) -> TestClient:
    app = Starlette(
        routes=web_routes(gw),  # type: ignore[arg-type]
        exception_handlers={HTTPException: http_error},
    )
    return TestClient(app)


def test_pages_carry_their_security_headers(pages: Path) -> None:
    with client(FakeGateway(host="127.0.0.1")) as http:
        for path, name in (("/phone", "phone.html"), ("/console", "console.html")):
            page = http.get(path)
            assert page.status_code == 200
            assert page.content == (pages / name).read_bytes()
            assert page.headers["content-type"] == "text/html; charset=utf-8"
            csp = page.headers["content-security-policy"]
            assert "default-src 'self'" in csp and "media-src 'self' blob:" in csp
            assert "connect-src 'self'" in csp
            assert page.headers["x-frame-options"] == "DENY"


def test_pages_are_guarded_and_assets_are_not(pages: Path) -> None:
    with client(FakeGateway()) as http:
        assert http.get("/phone").status_code == 401
        assert http.get("/console").status_code == 401
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert http.get("/console", headers=bearer).status_code == 200
        script = http.get("/web/test.js")
        assert script.status_code == 200
        assert script.headers["content-type"] == "text/javascript; charset=utf-8"
        style = http.get("/web/test.css")
        assert style.headers["content-type"] == "text/css; charset=utf-8"


@pytest.mark.parametrize(
    "path",
    [
        "/web/notes.txt",  # not an allowed suffix
        "/web/phone.html",  # pages only under their own routes
        "/web/missing.js",
        "/web/..%2Fconftest.py",
        "/web/%2E%2E%2Funit%2Ftest_web_auth.js",
        "/web/.hidden.js",
        "/web/README.md",
    ],
)
def test_only_allowed_files_of_the_folder(pages: Path, path: str) -> None:
    with client(FakeGateway(host="127.0.0.1")) as http:
        answer = http.get(path)
        assert answer.status_code == 404
        assert answer.json()["error"] == "not_found"


def test_a_page_not_installed_is_404(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes_web, "WEB_DIR", tmp_path)
    with client(FakeGateway(host="127.0.0.1")) as http:
        assert http.get("/phone").status_code == 404
