"""A minimal headless-Chromium driver for tests, over the Chrome DevTools Protocol.

Chromium is started with ``--remote-debugging-pipe``: it reads CDP commands from file
descriptor 3 and writes replies and events to descriptor 4, each message JSON ending in
a NUL byte. No port, no websocket library, no extra dependency: only Debian's
``chromium`` (``apt-get install -y chromium``).

``Chromium().open(path)`` loads a file in a fresh tab and returns a ``Page`` that
records console errors, uncaught exceptions, log errors (e.g. a blocked resource) and
JavaScript dialogs (an ``alert`` is dismissed and recorded, so it cannot hang a test).
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--remote-debugging-pipe",
)
TIMEOUT_S = 30.0


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class BrowserError(RuntimeError):
    pass


@dataclass
class PageEvents:
    """What the page did: console errors, uncaught exceptions, log errors, dialogs."""

    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    log_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)

    def errors(self) -> list[str]:
        return self.console_errors + self.exceptions + self.log_errors


class Chromium:
    """One headless Chromium with a fresh profile; use as a context manager."""

    def __init__(self, executable: str | None = None) -> None:
        executable = executable or find_chromium()
        if executable is None:
            raise BrowserError("chromium is not installed; apt-get install -y chromium")
        self._profile = tempfile.mkdtemp(prefix="sinkscope-chromium-")
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()

        def map_pipes() -> None:  # in the child: the pipes become descriptors 3 and 4
            read_end, write_end = os.dup(to_browser_read), os.dup(from_browser_write)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self._process = subprocess.Popen(
            [executable, *CHROMIUM_FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            preexec_fn=map_pipes,
            close_fds=False,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._pages: dict[str, Page] = {}
        self.send("Browser.getVersion")

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._process.poll() is None:
            try:
                self.send("Browser.close")
            except (BrowserError, OSError):
                pass
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    # protocol ---------------------------------------------------------------------------
    def pump(self, deadline: float) -> bool:
        """Read one message: a reply is kept for ``send``, an event goes to its page (which
        may send commands itself, e.g. to dismiss a dialog). False when ``deadline`` passed."""
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            ready, _, _ = select.select([self._from_browser], [], [], remaining)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError("chromium closed the DevTools pipe")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        if "id" in message:
            self._replies[message["id"]] = message
        elif message.get("sessionId") in self._pages:
            self._pages[message["sessionId"]].record(message["method"], message.get("params", {}))
        return True

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send one command and wait for its reply."""
        self._next_id += 1
        number = self._next_id
        message: dict[str, Any] = {"id": number, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode("utf-8") + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while number not in self._replies:
            if not self.pump(deadline):
                raise BrowserError(f"chromium did not answer {method} within {TIMEOUT_S:.0f} s")
        reply = self._replies.pop(number)
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    # pages ------------------------------------------------------------------------------
    def open(self, path: Path, width: int = 1280, height: int = 900) -> Page:
        """Open ``path`` in a new tab and wait for its load event."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = self._pages[session] = Page(self, session)
        for domain in ("Page", "Runtime", "Log"):
            page.send(f"{domain}.enable")
        page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        page.send("Page.navigate", {"url": Path(path).resolve().as_uri()})
        page.wait_for("Page.loadEventFired")
        return page


class Page:
    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser = browser
        self.session = session
        self.events = PageEvents()
        self.seen: set[str] = set()

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, session=self.session)

    def record(self, method: str, params: dict[str, Any]) -> None:
        self.seen.add(method)
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.events.console_errors.append(
                " ".join(str(arg.get("value", arg.get("description", ""))) for arg in params.get("args", []))
            )
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.events.exceptions.append(details.get("exception", {}).get("description") or details.get("text", ""))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.events.log_errors.append(params["entry"].get("text", ""))
        elif method == "Page.javascriptDialogOpening":
            self.events.dialogs.append(f"{params.get('type')}: {params.get('message')}")
            self.send("Page.handleJavaScriptDialog", {"accept": False})

    def wait_for(self, method: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while method not in self.seen:
            if not self.browser.pump(deadline):
                raise BrowserError(f"no {method} within {TIMEOUT_S:.0f} s")

    def settle(self, seconds: float = 0.3) -> None:
        """Take in the events that arrive within ``seconds`` (late console messages)."""
        deadline = time.monotonic() + seconds
        while self.browser.pump(deadline):
            pass

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:60]}...: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (press and release) at the centre of the first match."""
        x, y = self.evaluate(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)}); el.scrollIntoView({{block: 'center'}});"
            " const r = el.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def screenshot(self, path: Path, height: int | None = None) -> None:
        """A PNG of the page from the top (``height`` pixels; default the viewport)."""
        params: dict[str, Any] = {"format": "png"}
        if height is not None:
            width = self.evaluate("document.documentElement.clientWidth")
            params.update(
                captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
            )
        Path(path).write_bytes(base64.b64decode(self.send("Page.captureScreenshot", params)["data"]))


# JavaScript: the image's pixels whose colour is near rgb within tol, as [x, y, red, blue]
PIXELS = """
(async () => {{
  const img = Array.from(document.images).find(i => i.alt.includes({alt!r}));
  await img.decode();
  const c = document.createElement("canvas"); c.width = img.naturalWidth; c.height = img.naturalHeight;
  const g = c.getContext("2d"); g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data, out = [];
  for (let i = 0; i < d.length; i += 4) {{
    if (Math.abs(d[i] - {r}) <= {tol} && Math.abs(d[i + 1] - {g}) <= {tol} && Math.abs(d[i + 2] - {b}) <= {tol})
      out.push([(i / 4) % c.width, Math.floor(i / 4 / c.width), d[i], d[i + 2]]);
  }}
  return [c.width, c.height, out];
}})()
"""


def pixels(page, alt: str, colour: str, tol: int = 40, bluish: bool = False) -> tuple[int, int, list[tuple[int, int]]]:
    """(width, height, the (x, y) of pixels near ``colour``) of the image whose alt text
    holds ``alt``; ``bluish``: only those bluer than red (not the grey of antialiased text)."""
    r, g, b = (int(colour[k : k + 2], 16) for k in (1, 3, 5))
    width, height, found = page.evaluate(PIXELS.format(alt=alt, r=r, g=g, b=b, tol=tol))
    return width, height, [(x, y) for x, y, red, blue in found if not bluish or blue - red >= 10]
