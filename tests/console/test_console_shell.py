"""The console's shell and files: served at /ui by `trainyard serve` under a strict CSP, no token needed to
load them, nothing from another origin, every file the shell names shipped in the package."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from api.http.routers.console import STATIC

pytestmark = pytest.mark.slow


def test_every_page_is_the_shell_under_a_strict_csp(console_server):
    for path in ("/ui", "/ui/", "/ui/submit", "/ui/queue", "/ui/jobs/some-id"):
        resp = httpx.get(console_server.url + path)
        assert resp.status_code == 200, path
        assert resp.headers["content-type"].startswith("text/html")
        csp = resp.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "style-src 'self'" in csp
        assert resp.headers["x-content-type-options"] == "nosniff"
        # No inline script or style, and nothing from another origin.
        assert not re.search(r"<script(?![^>]*\bsrc=)", resp.text) and "<style" not in resp.text
        assert "http://" not in resp.text and "https://" not in resp.text


def test_assets_are_served_from_the_package_and_nothing_else_is(console_server):
    shipped = sorted(p.name for p in Path(STATIC).iterdir() if p.suffix in (".js", ".css"))
    assert "main.js" in shipped and "style.css" in shipped
    for name in shipped:
        resp = httpx.get(f"{console_server.url}/ui/static/{name}")
        assert resp.status_code == 200, name
        assert resp.headers["content-type"].split(";")[0] in ("text/javascript", "text/css")
        assert "script-src 'self'" in resp.headers["content-security-policy"]
        # No module reaches another origin, and no markup is built from strings.
        assert "innerHTML" not in resp.text and "https://" not in resp.text, name
        for imported in re.findall(r'from "\./([\w.]+)"', resp.text):
            assert imported in shipped, f"{name} imports {imported}, which is not shipped"
    for bad in ("../app.py", "..%2Fapp.py", "nope.js", ".hidden.js", "index.py"):
        assert httpx.get(f"{console_server.url}/ui/static/{bad}").status_code == 404, bad


def test_the_package_data_rule_ships_the_static_folder():
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '"api.http.console" = ["static/*"]' in pyproject
    assert STATIC == Path(__file__).parents[2] / "api" / "http" / "console" / "static"
