"""The HTTP server: Starlette app factory, OpenAI routes, SSE, access control."""

from strata.server.app import create_app

__all__ = ["create_app"]
