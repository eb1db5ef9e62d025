"""Access control as ASGI middleware.

- With `api_key` set: every path but `/health` and the web page `/` needs
  `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`), compared in constant time
  (`hmac.compare_digest`).
- Without a key: only loopback clients are served, and a request whose `Host` (or `Origin`,
  when present) names anything but localhost / 127.0.0.1 / ::1 is refused (DNS rebinding).
The body size limit is enforced where the body is read (`routes.read_json`, 413).
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any
from urllib.parse import urlsplit

from strata.server.openai_types import APIError

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
OPEN_PATHS = {"/health", "/v1/health", "/"}  # the web page carries no data (strata.server.webui)


def _is_loopback_ip(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _hostname(authority: str) -> str:
    """`host[:port]` → host, with `[::1]:8000` → `::1`."""
    return (urlsplit("//" + authority).hostname or "").lower()


def _loopback_name(host: str) -> bool:
    return host in LOOPBACK_NAMES or _is_loopback_ip(host)


class SecurityMiddleware:
    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check(scope)
        except APIError as e:
            await _send_error(send, e, e.body_for(scope["path"]))
            return
        await self.app(scope, receive, send)

    def _check(self, scope: Any) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.key:
            if scope["path"] in OPEN_PATHS:
                return
            auth = headers.get("authorization")
            if auth is not None:
                scheme, _, token = auth.partition(" ")
                token = token if scheme.lower() == "bearer" else ""
            else:  # Anthropic's clients send the key in x-api-key
                token = headers.get("x-api-key", "")
            ok = bool(token.strip()) and hmac.compare_digest(token.strip().encode(), self.key)
            if not ok:
                raise APIError(
                    401,
                    "missing or wrong API key (Authorization: Bearer …, or x-api-key)",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
            return
        client = scope.get("client")
        if client and not _is_loopback_ip(client[0]):
            raise APIError(403, "without an API key this server only serves loopback clients")
        host = headers.get("host")
        if host is None or not _loopback_name(_hostname(host)):
            raise APIError(403, f"Host {host!r} not allowed (set an API key to serve others)")
        origin = headers.get("origin")
        if origin and origin != "null":
            name = (urlsplit(origin).hostname or "").lower()
            if not _loopback_name(name):
                raise APIError(403, f"Origin {origin!r} not allowed")


async def _send_error(send: Any, e: APIError, obj: dict[str, Any]) -> None:
    import msgspec

    body = msgspec.json.encode(obj)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in e.headers.items()]
    await send({"type": "http.response.start", "status": e.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
