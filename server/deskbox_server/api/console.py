"""The web console: ``GET /`` (sessions: thumbnails, create, delete, pause, live view links,
recordings) and ``GET /replay`` (a recording's steps over its frames).

Both are static pages from the repository's top-level ``vnc/`` (``console.html``,
``replay.html``), their scripts and style under ``/vnc/static`` (mounted by api/vnc.py).
They carry no credentials: the page asks for an API key, keeps it in the tab's
``sessionStorage`` and calls the API with it as a bearer header, so the API's own key
scoping is all the console sees. The pages are not in the OpenAPI document: they are for
people, not clients.
"""

from __future__ import annotations

from pathlib import Path
from string import Template

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from .vnc import STATIC_PATH

__all__ = ["PAGE_HEADERS", "router"]

_VIEWER_DIR = Path(__file__).resolve().parent.parent / "viewer"
# As the live view's page, without inline style: the console sets styles only through the
# CSSOM, which CSP does not govern. Blob URLs are the thumbnails and frames, fetched with
# the bearer header (an <img src> could not send it).
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": (
        "default-src 'self'; connect-src 'self'; img-src 'self' blob:; media-src 'self' blob:; "
        "style-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
}


def _page(name: str) -> str:
    return Template((_VIEWER_DIR / name).read_text()).substitute(static=STATIC_PATH)


def router() -> APIRouter:
    """The console's routes, their pages read here, once, when the app is built (no file
    I/O on the event loop)."""
    pages = APIRouter(tags=["console"], include_in_schema=False)
    console, replay = _page("console.html"), _page("replay.html")

    @pages.get("/", response_class=HTMLResponse)
    async def console_page() -> HTMLResponse:
        return HTMLResponse(console, headers=PAGE_HEADERS)

    @pages.get("/replay", response_class=HTMLResponse)
    async def replay_page() -> HTMLResponse:
        return HTMLResponse(replay, headers=PAGE_HEADERS)

    return pages
