"""A headless Chromium (Debian's package) driven over the Chrome DevTools protocol, for the
web page test.

The CDP client is these few lines over `websocket-client` (maintained, on PyPI): the CDP
wrappers on PyPI are unmaintained (pychrome) or download their own browser (playwright,
pyppeteer), which a machine without network access cannot do. Every wait is bounded.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


class CDPError(RuntimeError):
    pass


class Browser:
    """One headless browser with one page; `call` sends a command and waits for its answer."""

    def __init__(self, exe: str, width: int = 1440, height: int = 900) -> None:
        # chromium's helper processes may still write the profile as it closes: scratch only
        self.profile = tempfile.TemporaryDirectory(
            prefix="strata-chromium-", ignore_cleanup_errors=True
        )
        self.proc = subprocess.Popen(
            [
                exe,
                "--headless=new",
                "--no-sandbox",  # root in CI containers
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-port=0",
                f"--user-data-dir={self.profile.name}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port = self._port(Path(self.profile.name) / "DevToolsActivePort")
        page = self._page_target(port)
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30)
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def _port(self, path: Path, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise CDPError(f"chromium exited with {self.proc.returncode}")
            with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
                return int(path.read_text().split()[0])
            time.sleep(0.05)
        raise CDPError("chromium never opened its DevTools port")

    @staticmethod
    def _page_target(port: int) -> dict[str, Any]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                pages = [t for t in json.load(r) if t.get("type") == "page"]
            if pages:
                return dict(pages[0])
            time.sleep(0.05)
        raise CDPError("no page target")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        cid = next(self.ids)
        self.ws.send(json.dumps({"id": cid, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == cid:
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error']}")
                out: dict[str, Any] = msg.get("result", {})
                return out
            if "method" in msg:
                self.events.append(msg)

    def eval(self, expr: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise CDPError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def goto(self, url: str, timeout: float = 30.0) -> None:
        self.call("Page.navigate", url=url)
        self.wait("document.readyState === 'complete'", timeout)

    def wait(self, expr: str, timeout: float = 30.0, every: float = 0.05) -> Any:
        """The first truthy value of `expr`, polled; TimeoutError with the last value."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.eval(expr)
            if last:
                return last
            time.sleep(every)
        raise TimeoutError(f"{expr} stayed {last!r} for {timeout} s")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def console_errors(self) -> list[str]:
        out = []
        for e in self.events:
            if e["method"] == "Runtime.exceptionThrown":
                out.append(str(e["params"]["exceptionDetails"]))
            elif e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] == "error":
                out.append(str(e["params"]["args"]))
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.profile.cleanup()
