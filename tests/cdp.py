"""A small Chrome DevTools Protocol client: headless Chromium (Debian's ``chromium``) driven
over its websocket, for the console's browser tests.

:class:`Browser` starts ``chromium --headless=new`` on a free DevTools port (it writes the
port to ``DevToolsActivePort`` in its profile), attaches to its page and collects what a
person would see in the DevTools console: ``Runtime.consoleAPICalled`` errors and warnings,
``Runtime.exceptionThrown`` and ``Log.entryAdded`` errors (CSP violations among them).
Waiting is on DOM conditions (:meth:`Browser.wait_for`), never on time.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import threading
import urllib.request
from pathlib import Path
from typing import Any

import websocket

from tests.waiting import eventually

CHROMIUM = os.environ.get("COULER_CHROMIUM", "/usr/bin/chromium")
WAIT = 60.0  # a bound on waiting, never an assertion about speed


class CdpError(AssertionError):
    pass


class Browser:
    """One headless Chromium with one page; ``close()`` ends it."""

    def __init__(self, profile: Path) -> None:
        if shutil.which(CHROMIUM) is None:
            raise CdpError(f"{CHROMIUM} is not installed (apt-get install -y chromium; "
                           ".ci/run does it)")
        profile.mkdir(parents=True, exist_ok=True)
        self._log = (profile / "chromium.log").open("wb")
        self._proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
             "--disable-extensions", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--metrics-recording-only",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", "--window-size=1400,1000", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        active = profile / "DevToolsActivePort"
        try:
            eventually(lambda: self._proc.poll() is not None or (
                active.exists() and len(active.read_text().splitlines()) >= 2),
                "chromium's DevTools port", WAIT)
            if self._proc.poll() is not None:
                raise CdpError(f"chromium exited ({self._proc.returncode}): "
                               f"{(profile / 'chromium.log').read_text()[-2000:]}")
            port = int(active.read_text().splitlines()[0])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list",
                                        timeout=WAIT) as answer:
                targets = json.loads(answer.read())
            page = next(t for t in targets if t.get("type") == "page")
            self._ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=WAIT,
                                                   suppress_origin=True)
        except BaseException:
            self.close()
            raise
        self._next = 0
        self._lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self.problems: list[str] = []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")

    # ----------------------------------------------------------------- protocol

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one command; its result (events meanwhile are collected)."""
        with self._lock:
            self._next += 1
            ident = self._next
            self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
            while True:
                message = json.loads(self._ws.recv())
                if message.get("id") == ident:
                    if "error" in message:
                        raise CdpError(f"{method}: {message['error']}")
                    return dict(message.get("result", {}))
                if "method" in message:
                    self._event(message)

    def _event(self, message: dict[str, Any]) -> None:
        self.events.append(message)
        method, params = message["method"], message.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning",
                                                                         "assert"):
            said = " ".join(str(a.get("value", a.get("description", "")))
                            for a in params.get("args", []))
            self.problems.append(f"console.{params['type']}: {said}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.problems.append("exception: " + str(
                details.get("exception", {}).get("description") or details.get("text")))
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            if entry.get("level") in ("error", "warning"):
                self.problems.append(f"log {entry.get('source')}/{entry.get('level')}: "
                                     f"{entry.get('text')} ({entry.get('url', '')})")

    def pump(self) -> None:
        """Collect the events sent since the last command."""
        self.call("Runtime.evaluate", expression="0")

    # ----------------------------------------------------------------- pages

    def navigate(self, url: str) -> None:
        """Open ``url`` and wait until its document has loaded."""
        loads = sum(1 for e in self.events if e["method"] == "Page.loadEventFired")
        result = self.call("Page.navigate", url=url)
        if result.get("errorText"):
            raise CdpError(f"{url}: {result['errorText']}")
        eventually(lambda: self._loaded(loads), f"{url} loaded", WAIT)

    def _loaded(self, before: int) -> bool:
        self.pump()
        return sum(1 for e in self.events if e["method"] == "Page.loadEventFired") > before \
            and self.evaluate("document.readyState") == "complete"

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise CdpError(f"{expression}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, what: str, timeout: float = WAIT) -> Any:
        """Wait until ``expression`` is truthy in the page; its value."""
        got: list[Any] = []

        def check() -> bool:
            got[:] = [self.evaluate(expression)]
            return bool(got[0])

        eventually(check, what, timeout)
        return got[0]

    def submit_and_wait(self, form_expression: str) -> None:
        """Submit a form (``form.submit()``: no confirm dialog) and wait for the next page."""
        loads = sum(1 for e in self.events if e["method"] == "Page.loadEventFired")
        self.evaluate(f"({form_expression}).submit(), 0")
        eventually(lambda: self._loaded(loads), "the form's answer loaded", WAIT)

    def screenshot(self, path: Path) -> Path:
        """The page as a PNG at ``path`` (the whole page, not only the window)."""
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def take_problems(self) -> list[str]:
        """The console problems collected so far (and forget them)."""
        self.pump()
        out, self.problems = self.problems, []
        return out

    def close(self) -> None:
        ws = getattr(self, "_ws", None)
        if ws is not None:
            ws.close()
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()

