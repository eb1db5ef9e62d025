"""llama-server's slots: `GET /slots` (each slot's request and the positions its KV holds), and
its slot actions (`--slot-save-path`): `POST /slots/{id}?action=save|restore|erase`
with `{"filename": NAME}` for save and restore. A save writes the slot's sequence and KV to
NAME in the folder; a restore reads them back into the slot, so the next prompt sharing the
sequence's prefix is placed there and reads only the rest (the engine: `engine/slot_actions.py`,
the file: `engine/slot_files.py`); an erase empties the slot. An action on a slot a request
holds runs once it is free. Answers as llama-server's: `id_slot`, `filename`, `n_saved` /
`n_written` (bytes), `n_restored` / `n_read` (bytes), `n_erased`, `timings`."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from strata.engine.client import DeadlineExceeded, EngineError, Unavailable
from strata.engine.protocol import SlotVerb
from strata.engine.slot_files import valid_filename
from strata.server.openai_types import APIError
from strata.server.routes import _state, engine_error, read_json

ACTIONS: tuple[str, ...] = get_args(SlotVerb)


async def slots(request: Request) -> Response:
    """llama-server's `GET /slots`: per slot its `id`, `n_ctx`, `is_processing`, `id_task`
    (the engine's request id, -1 when idle) and `n_past` (the positions its KV holds, which a
    prompt sharing them reuses), as of the engine's last counters (at most a second old)."""
    st = _state(request)
    c = st.client
    if c is None or c.loaded is None:
        raise APIError(503, "model is loading", code="loading")
    info = c.stats.info if c.stats is not None else {}
    n_ctx = c.loaded.n_ctx_seq
    rows = info.get("slots") or [{"id": i, "id_task": -1, "n_past": 0} for i in range(c.slots)]
    return JSONResponse(
        [
            {
                **r,
                "n_ctx": n_ctx,
                "is_processing": r["id_task"] >= 0,
                "speculative": bool(info.get("spec")),
            }
            for r in rows
        ]
    )


async def slot_action(request: Request) -> Response:
    st = _state(request)
    folder = st.config.slot_save_path
    if not folder:
        raise APIError(
            501,
            "this server does not support slot actions: start it with --slot-save-path",
            code="not_supported",
        )
    slot = int(request.path_params["id_slot"])
    action = request.query_params.get("action", "")
    if action not in ACTIONS:
        raise APIError(400, f"action: one of {', '.join(ACTIONS)}", param="action")
    path = ""
    if action != "erase":
        body = await read_json(request)
        name = body.get("filename")
        if not isinstance(name, str) or not valid_filename(name):
            raise APIError(
                400,
                "filename: a plain file name (letters, digits, '.', '_', '-'; not hidden)",
                param="filename",
            )
        path = str(Path(folder) / name)
        if action == "restore" and not Path(path).is_file():
            raise APIError(404, f"no slot file {name!r}", param="filename")
    client = st.client
    if client is None:
        raise APIError(503, "engine not started", code="unavailable")
    if not 0 <= slot < client.slots:
        raise APIError(400, f"id_slot: 0..{client.slots - 1}", param="id_slot")
    try:
        done = await client.slot_action(slot, action, path)  # type: ignore[arg-type]
    except (EngineError, DeadlineExceeded, Unavailable) as e:
        raise engine_error(e) from None
    if done.error:
        # a file that is not this model's: the request's; a save the folder refused: the
        # server's
        raise APIError(500 if action == "save" else 400, done.error)
    return JSONResponse(done.result)


routes = [
    Route("/slots", slots, methods=["GET"]),
    Route("/slots/{id_slot:int}", slot_action, methods=["POST"]),
]
