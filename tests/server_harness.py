"""A real uvicorn on 127.0.0.1 (a subprocess) serving the fake engine, for the server tests.

httpx's in-process ASGI transport buffers streams, so streaming, disconnect and shutdown need
a real server. Every wait here is bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, wait_ready: bool = True, **settings: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop)
        env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
        env["STRATA_ENGINE"] = "fake"
        for k, v in settings.items():
            env["STRATA_" + k.upper()] = str(v)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "strata.app:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.http = httpx.Client(base_url=self.url, timeout=10)
        if wait_ready:
            try:
                self.wait(lambda r: r.status_code == 200)
            except BaseException:
                self.stop()  # a server that never came up is not left running
                raise

    def wait(self, ok: Any, path: str = "/health", timeout: float = 30.0) -> httpx.Response:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.output()}")
            try:
                r = self.http.get(path)
                if ok(r):
                    return r
                last = r
            except httpx.TransportError as e:
                last = e
            time.sleep(0.05)
        raise TimeoutError(f"{path} never ok; last {last!r}")

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = self.http.get("/v1/status").json()
        return out

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        with contextlib.suppress(Exception):
            self.log.close()
        return int(self.proc.returncode)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_until(cond: Any, timeout: float = 10.0, every: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return bool(cond())
