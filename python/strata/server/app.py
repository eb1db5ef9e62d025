"""The Starlette app factory. The lifespan owns the server state (tokenizer, engine client):
it starts loading in the background (so /health can answer 503 meanwhile) and drains on the
way out. Under uvicorn, SIGTERM/SIGINT first drain (new requests get 503, running ones finish,
up to `drain_timeout_s`) and only then hand over to uvicorn's own shutdown; a second signal
stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from strata.config import Config
from strata.server.anthropic_api import routes as anthropic_routes
from strata.server.native_api import routes as native_routes
from strata.server.openai_types import APIError
from strata.server.responses_api import routes as responses_routes
from strata.server.routes import routes
from strata.server.security import SecurityMiddleware
from strata.server.slots_api import routes as slots_routes
from strata.server.state import ServerState

log = logging.getLogger("strata.server")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body_for(request.url.path), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    msg = {404: f"no route {request.url.path}", 405: f"method {request.method} not allowed"}
    e = APIError(exc.status_code, msg.get(exc.status_code, str(exc.detail)))
    return JSONResponse(
        e.body_for(request.url.path), status_code=e.status, headers=dict(exc.headers or {})
    )


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    e = APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")
    return JSONResponse(e.body_for(request.url.path), status_code=500)


def _install_drain(st: ServerState) -> None:
    """Wrap uvicorn's signal handlers (installed before the lifespan starts) with a drain."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        prev = signal.getsignal(sig)
        if not callable(prev):
            continue

        def handler(signum: int, frame: Any, prev: Any = prev) -> None:
            if st.status == "draining":  # second signal: stop now
                prev(signum, frame)
                return

            async def drain_then_exit() -> None:
                await st.drain()
                prev(signum, None)

            loop.call_soon_threadsafe(lambda: loop.create_task(drain_then_exit()))

        with contextlib.suppress(ValueError):  # not the main thread: no signals to wrap
            signal.signal(sig, handler)


def create_app(config: Config | None = None) -> Starlette:
    config = config or Config.load()
    st = ServerState(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        st.begin()
        _install_drain(st)
        try:
            yield
        finally:
            await st.shutdown()

    app = Starlette(
        routes=[*routes, *anthropic_routes, *responses_routes, *native_routes, *slots_routes],
        middleware=[Middleware(SecurityMiddleware, api_key=config.api_key)],
        exception_handlers={
            APIError: _api_error,
            HTTPException: _http_error,
            Exception: _server_error,
        },
        lifespan=lifespan,
    )
    app.state.strata = st
    return app
