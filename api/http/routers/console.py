"""The web console at /ui: one HTML shell and its ES modules and CSS, shipped in the package.

No token is needed to load the shell; every datum the pages show comes from /v1 with the token the user
types in (kept in the tab's sessionStorage). The Content-Security-Policy allows only this origin's
scripts and styles, never inline ones, so text that reached the pages from a job cannot run.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

STATIC = Path(__file__).resolve().parent.parent / "console" / "static"
CONTENT_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                 ".html": "text/html; charset=utf-8"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}

router = APIRouter(tags=["console"], include_in_schema=False)


def _shell() -> Response:
    return FileResponse(STATIC / "index.html", media_type=CONTENT_TYPES[".html"], headers=HEADERS)


# Every page is the same shell; the modules read the path and draw the page (a reload keeps the page).
@router.get("/ui")
@router.get("/ui/")
@router.get("/ui/submit")
@router.get("/ui/queue")
@router.get("/ui/compare")
def console_page() -> Response:
    return _shell()


@router.get("/ui/jobs/{job_id}")
def console_job_page(job_id: str) -> Response:
    return _shell()


@router.get("/ui/static/{name}")
def console_asset(name: str) -> Response:
    """One file of the static folder by its plain name (no sub-folders, so no way out of it)."""
    path = STATIC / name
    content_type = CONTENT_TYPES.get(path.suffix)
    if "/" in name or name.startswith(".") or content_type is None or not path.is_file():
        return Response("no such console file\n", status_code=404, media_type="text/plain", headers=HEADERS)
    return FileResponse(path, media_type=content_type, headers=HEADERS)
