"""llama-server's slot actions in the engine (`/slots/{id}?action=save|restore|erase`,
`SlotAction`): a slot's sequence and KV written to a file (`slot_files`), read back into a slot
(the next prompt sharing its prefix is placed there and reads only the rest), or erased. An
action on a slot a request holds waits until it is free (as llama-server defers it); the engine
loop runs the waiting ones before each step admits new requests."""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Container
from pathlib import Path
from typing import Any

from strata.engine.prefix import SlotCache
from strata.engine.protocol import SlotAction, SlotDone
from strata.engine.slot_files import read_slot, write_slot

log = logging.getLogger("strata.engine")


class SlotActions:
    def __init__(self, slots: SlotCache, model: Callable[[], str]) -> None:
        self.slots = slots
        # the fingerprint a file must carry to be restored here (found at the first action)
        self._model = functools.cache(model)
        self.waiting: deque[SlotAction] = deque()

    def add(self, msg: SlotAction) -> None:
        self.waiting.append(msg)

    def run(self, busy: Container[int]) -> list[SlotDone]:
        """The waiting actions whose slot is free, in order (a later action on a busy slot
        waits behind an earlier one on it)."""
        out, held, blocked = [], deque[SlotAction](), set()
        while self.waiting:
            msg = self.waiting.popleft()
            if msg.slot in busy or msg.slot in blocked:
                held.append(msg)
                blocked.add(msg.slot)
            else:
                out.append(self._run(msg))
        self.waiting = held
        return out

    def _run(self, msg: SlotAction) -> SlotDone:
        n_slots = len(self.slots.tokens)
        if not 0 <= msg.slot < n_slots:
            return SlotDone(msg.rid, {}, f"no slot {msg.slot}: the engine has {n_slots}")
        t0 = time.perf_counter()
        try:
            result = getattr(self, f"_{msg.action}")(msg)
        except (OSError, ValueError) as e:
            return SlotDone(msg.rid, {}, str(e))
        except Exception as e:  # the backend's own types (a native error): the engine goes on
            log.warning("slot %d %s failed: %s", msg.slot, msg.action, e)
            return SlotDone(msg.rid, {}, f"{type(e).__name__}: {e}")
        ms = (time.perf_counter() - t0) * 1e3
        if msg.action != "erase":
            result["timings"] = {f"{msg.action}_ms": ms}
        return SlotDone(msg.rid, {"id_slot": msg.slot, **result})

    def _save(self, msg: SlotAction) -> dict[str, Any]:
        toks = list(self.slots.tokens[msg.slot])
        path = Path(msg.path)
        n = write_slot(path, self._model(), toks, self.slots.export(msg.slot))
        return {"filename": path.name, "n_saved": len(toks), "n_written": n}

    def _restore(self, msg: SlotAction) -> dict[str, Any]:
        path = Path(msg.path)
        toks, kv, n_read = read_slot(path, self._model())
        n = self.slots.restore(msg.slot, toks, kv)
        return {"filename": path.name, "n_restored": n, "n_read": n_read}

    def _erase(self, msg: SlotAction) -> dict[str, Any]:
        n = len(self.slots.tokens[msg.slot])
        self.slots.lost(msg.slot)
        return {"n_erased": n}
