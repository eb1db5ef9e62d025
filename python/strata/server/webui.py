"""The web page at `/`: one static HTML file shipped in the package (`web/index.html`; no build
step, no CDN). It reads only this server's own endpoints (/metrics JSON view, /v1/status,
/v1/chat/completions), which the content security policy enforces.

The page itself carries no data, so it is served without the API key (like /health); the
page asks for the key and sends it with its API calls.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from starlette.requests import Request
from starlette.responses import Response

CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


@cache
def page() -> bytes:
    return files("strata.server").joinpath("web/index.html").read_bytes()


async def index(request: Request) -> Response:
    return Response(
        page(),
        media_type="text/html; charset=utf-8",
        headers={
            "cache-control": "no-cache",
            "content-security-policy": CSP,
            "x-content-type-options": "nosniff",
            "referrer-policy": "no-referrer",
        },
    )
