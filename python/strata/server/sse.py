"""Server-sent events: the `data: …` framing and an ASGI response that stops on disconnect.

`SSEResponse` sends the 200 head at once, then races the body iterator against the client's
`http.disconnect`: when the client goes, the iterator is cancelled and `on_close` runs (the
route uses it to abort the engine sequences), so a slot is freed within one engine step.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import msgspec

_json = msgspec.json.Encoder()

DONE = b"data: [DONE]\n\n"


def event(obj: Any) -> bytes:
    return b"data: " + _json.encode(obj) + b"\n\n"


def named_event(name: str, obj: Any) -> bytes:
    """An event with an `event:` line (Anthropic's stream names every event)."""
    return b"event: " + name.encode() + b"\ndata: " + _json.encode(obj) + b"\n\n"


class SSEResponse:
    def __init__(
        self,
        body: AsyncIterator[bytes],
        on_close: Callable[[], None],
        headers: dict[str, str] | None = None,
    ) -> None:
        self.body = body
        self.on_close = on_close
        self.headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "x-accel-buffering": "no",
            **(headers or {}),
        }

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(k.encode(), v.encode()) for k, v in self.headers.items()],
                }
            )
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    while True:
                        msg = await receive()
                        if msg["type"] == "http.disconnect":
                            tg.cancel_scope.cancel()
                            return

                tg.start_soon(watch)
                try:
                    async for chunk in self.body:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                except OSError:  # the client went away while we wrote
                    pass
                tg.cancel_scope.cancel()
        finally:
            self.on_close()
            aclose = getattr(self.body, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
