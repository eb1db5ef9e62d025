"""The messages that cross the server ↔ engine process boundary, and their framing.

A frame is a 4-byte big-endian payload length followed by one msgpack-encoded message; the
message type is a msgspec tagged union (tag field "t"). Only token ids cross, never text.

Conversation:
  server → engine  Start(version, config)          once, first frame
  engine → server  Loaded(version, model info)     when the backend is ready (or Failed)
  server → engine  Submit / Abort / SlotAction / Shutdown
  engine → server  Progress (a prompt chunk done), Tokens (per step per sequence, the last one
                   carries `finish`), SlotDone (a slot action's answer), Stats (backend
                   counters), Failed (engine-wide error)
A `Submit` whose `rid` is reused while still running is refused with Tokens(finish="error").
"""

from __future__ import annotations

import socket
import struct
from typing import Any, Literal

import msgspec

from strata.sampling import SamplingParams

PROTOCOL_VERSION = 3
MAX_FRAME = 64 << 20  # bytes; a prompt of 4M tokens fits many times over
_HEADER = struct.Struct(">I")

Finish = Literal["stop", "length", "abort", "error"]


class Start(msgspec.Struct, tag="start", tag_field="t"):
    version: int
    config: dict[str, Any]  # strata.config.Config fields


class Loaded(msgspec.Struct, tag="loaded", tag_field="t"):
    version: int
    pid: int
    n_vocab: int
    n_ctx: int  # positions of all sequences together (llama.cpp's; 0 in the settings resolved)
    n_ctx_seq: int  # positions one sequence may hold (n_ctx / parallel)
    max_slots: int
    info: dict[str, Any]  # backend description for /v1/status (kind, path, tiers, …)
    stats: list[Stat] = []  # the first counters, so /metrics has them from the start


class Submit(msgspec.Struct, tag="submit", tag_field="t"):
    rid: int
    prompt: list[int]
    params: SamplingParams
    max_tokens: int  # >= 1; the engine also stops at the context end ("length")
    stop_ids: list[int]  # end-of-generation ids: finish "stop", not reported as output


class Abort(msgspec.Struct, tag="abort", tag_field="t"):
    rid: int


class Shutdown(msgspec.Struct, tag="shutdown", tag_field="t"):
    pass


SlotVerb = Literal["save", "restore", "erase"]


class SlotAction(msgspec.Struct, tag="slot", tag_field="t"):
    """llama-server's `/slots/{id}?action=`: a slot's sequence and KV saved to or restored
    from `path`, or erased; run when the slot is idle (deferred while a request holds it)."""

    rid: int
    slot: int
    action: SlotVerb
    path: str = ""  # the file, for save and restore


class SlotDone(msgspec.Struct, tag="slot_done", tag_field="t"):
    rid: int
    result: dict[str, Any]  # llama-server's answer fields (n_saved, n_restored, n_erased, …)
    error: str = ""  # why the action failed (result empty)


class Progress(msgspec.Struct, tag="progress", tag_field="t"):
    rid: int
    done: int  # prompt tokens processed so far
    total: int


class Tokens(msgspec.Struct, tag="tokens", tag_field="t"):
    rid: int
    ids: list[int]  # new output tokens (may be empty on the finishing message)
    logprobs: list[float] | None = None  # one per id, when asked for
    top: list[list[tuple[int, float]]] | None = None  # one list per id, when asked for
    finish: Finish | None = None
    message: str = ""  # why, when finish is "error"
    prompt_s: float = 0.0  # on finish: seconds spent on the prompt
    cached_tokens: int = 0  # on finish: prompt tokens whose KV was reused, not run
    drafts_offered: int | None = None  # on finish, when the engine speculates
    drafts_accepted: int | None = None
    # On finish, with a VRAM expert tier (hybrid GPU): routed (token, expert) pairs of the
    # steps this request ran in, served from VRAM / computed by the CPU / copied over PCIe.
    # None on the CPU-only path.
    expert_hits: int | None = None
    expert_miss_cpu: int | None = None
    expert_miss_pcie: int | None = None
    # On finish "stop": the sequence sampled a stop id (end of generation), which `ids` leaves
    # out; the usage counts it as a generated token, as llama-server and vLLM do.
    stop_id: bool = False
    slot: int = -1  # on finish: the slot the sequence ran in (-1: none: refused at once)


class Stat(msgspec.Struct, array_like=True):
    name: str  # Prometheus name without the strata_ prefix, e.g. "expert_hits_total"
    kind: Literal["counter", "gauge"]
    labels: dict[str, str]
    value: float


class Stats(msgspec.Struct, tag="stats", tag_field="t"):
    stats: list[Stat]
    info: dict[str, Any]  # tier state etc. for /v1/status


class Failed(msgspec.Struct, tag="failed", tag_field="t"):
    message: str  # the engine cannot go on (load failed, version mismatch, …)


ToEngine = Start | Submit | Abort | SlotAction | Shutdown
FromEngine = Loaded | Progress | Tokens | SlotDone | Stats | Failed

_enc = msgspec.msgpack.Encoder()
_dec_to_engine = msgspec.msgpack.Decoder(ToEngine)
_dec_from_engine = msgspec.msgpack.Decoder(FromEngine)


class ProtocolError(Exception):
    """A frame that is too large, truncated or not a known message."""


def encode(msg: ToEngine | FromEngine) -> bytes:
    payload = _enc.encode(msg)
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    return _HEADER.pack(len(payload)) + payload


def frame_length(header: bytes) -> int:
    (n,) = _HEADER.unpack(header)
    if n > MAX_FRAME:
        raise ProtocolError(f"frame of {n} bytes exceeds {MAX_FRAME}")
    return int(n)


HEADER_SIZE = _HEADER.size


def decode_to_engine(payload: bytes) -> ToEngine:
    try:
        return _dec_to_engine.decode(payload)
    except msgspec.DecodeError as e:
        raise ProtocolError(f"bad frame for the engine: {e}") from None


def decode_from_engine(payload: bytes) -> FromEngine:
    try:
        return _dec_from_engine.decode(payload)
    except msgspec.DecodeError as e:
        raise ProtocolError(f"bad frame from the engine: {e}") from None


class FrameBuffer:
    """Bytes as they arrive off a stream socket, split into frame payloads."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    def take(self) -> bytes | None:
        """The next whole frame's payload, or None until more bytes come; raises
        ProtocolError on an oversized frame."""
        if len(self._buf) < HEADER_SIZE:
            return None
        n = frame_length(bytes(self._buf[:HEADER_SIZE]))
        if len(self._buf) < HEADER_SIZE + n:
            return None
        payload = bytes(self._buf[HEADER_SIZE : HEADER_SIZE + n])
        del self._buf[: HEADER_SIZE + n]
        return payload


class FrameSocket:
    """Blocking framed socket for the engine side; `poll` lets the step loop peek for input."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._frames = FrameBuffer()

    def send(self, *msgs: ToEngine | FromEngine) -> None:
        self.sock.sendall(b"".join(encode(m) for m in msgs))

    def recv_ready(self, timeout: float | None) -> list[bytes]:
        """Frames available within `timeout` seconds (None: block until at least one).
        Raises EOFError when the peer has closed."""
        out: list[bytes] = []
        self.sock.settimeout(timeout)
        try:
            while True:
                payload = self._frames.take()
                if payload is not None:
                    out.append(payload)
                    self.sock.settimeout(0.0)
                    continue
                try:
                    chunk = self.sock.recv(1 << 16)
                except (BlockingIOError, TimeoutError):
                    return out
                if not chunk:
                    if out:  # hand over what came before the end; the next call raises
                        return out
                    raise EOFError("peer closed the connection")
                self._frames.feed(chunk)
                if out:
                    self.sock.settimeout(0.0)
        finally:
            self.sock.settimeout(None)
