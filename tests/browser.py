"""A headless Chromium for tests, driven over its DevTools protocol on a pipe: the standard
library only (``--remote-debugging-pipe``: JSON messages, each ended by a NUL byte, read by the
browser from fd 3 and written by it to fd 4).

``Browser.open`` loads a page at a given window width and returns what the tests check: the
console errors it raised (script errors, failed loads), and what a script measured in the page
(``PROBE``). ``Browser.screenshot`` writes the whole page as a PNG.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Debian's package installs ``chromium``; other systems name it otherwise
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
TIMEOUT_S = 20.0

#: measured in the page after it loaded: the viewport's width; every element wider than the
#: window (measured against the box that clips it: an element inside a scrolling box is that
#: box's, and the box itself is measured); the first table; every linked file; every image's
#: natural and shown width; where each figure sits; each scrolling box's widths; the text
PROBE = r"""
(() => {
  const vw = document.documentElement.clientWidth;
  const name = el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
    (typeof el.className === 'string' && el.className ? '.' + el.className.split(' ').join('.') : '');
  const clipped = el => {
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      if (['auto', 'scroll', 'hidden'].includes(getComputedStyle(a).overflowX)) return true;
    }
    return false;
  };
  const wide = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (clipped(el)) continue;
    const r = el.getBoundingClientRect();
    if (r.right > vw + 0.5 || r.left < -0.5) wide.push(name(el) + ' ' + Math.round(r.width) + 'px');
    else if (getComputedStyle(el).overflowX === 'visible' && r.left + el.scrollWidth > vw + 0.5) {
      wide.push(name(el) + ': its content, ' + el.scrollWidth + 'px');  // text that spills out
    }
  }
  const table = document.querySelector('table'), figure = document.querySelector('figure');
  return {
    viewport: vw,
    page_width: document.documentElement.scrollWidth,
    wide: wide,
    first_table: table ? {id: table.id, cls: table.className} : null,
    first_table_before_charts: table !== null && (figure === null ||
      (figure.compareDocumentPosition(table) & Node.DOCUMENT_POSITION_PRECEDING) !== 0),
    links: [...document.querySelectorAll('[href], [src]')].map(e =>
      e.getAttribute('href') || e.getAttribute('src')),
    images: [...document.images].map(i => ({src: i.getAttribute('src'), natural: i.naturalWidth,
      shown: i.getBoundingClientRect().width, loaded: i.complete && i.naturalWidth > 0})),
    headings: [...document.querySelectorAll('h2')].map(h => h.textContent),
    figures: [...document.querySelectorAll('figure')].map(f => {
      const r = f.getBoundingClientRect();
      return {id: f.id, top: Math.round(r.top + window.scrollY), left: Math.round(r.left)};
    }),
    boxes: [...document.querySelectorAll('.scroll')].map(e => ({first: name(e.firstElementChild),
      cls: e.className, scroll: e.scrollWidth, client: e.clientWidth})),
    text: document.body.innerText,
  };
})()
"""


def find_chromium() -> str | None:
    return next((path for name in NAMES if (path := shutil.which(name))), None)


@dataclass
class Page:
    errors: list[str]
    probe: dict[str, Any]


class Browser:
    """One headless Chromium; ``close`` (or ``with``) ends it."""

    def __init__(self, binary: str) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="shardbench-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def onto_3_and_4() -> None:  # in the child, before exec: the fds the protocol names
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w)]
            os.dup2(high[0], 3)  # via fds above 10: neither pipe end is lost if it was 3 or 4
            os.dup2(high[1], 4)

        args = [
            binary,
            "--headless",
            "--remote-debugging-pipe",
            "--no-sandbox",  # root in a container has no user namespace to sandbox with
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--hide-scrollbars",
            "--allow-file-access-from-files",
            f"--user-data-dir={self._profile.name}",
            "about:blank",
        ]
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=False,  # only the dup2'ed fds are inheritable (Python opens fds non-inheritable)
            preexec_fn=onto_3_and_4,  # noqa: PLW1509 - a single-threaded test process
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for method in ("Page.enable", "Runtime.enable", "Log.enable"):
            self._call(method, session=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._call("Browser.close")
        except (OSError, RuntimeError, TimeoutError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self._profile.cleanup()

    def open(self, path: Path, *, width: int, height: int = 900) -> Page:
        """Load ``path`` in a window ``width`` CSS pixels wide; the console errors it raised
        while loading, and ``PROBE``'s measurements."""
        self._set_size(width, height)
        self._events.clear()
        self._call("Page.navigate", {"url": path.resolve().as_uri()}, session=True)
        self._wait_for("Page.loadEventFired")
        probe = self.evaluate(PROBE)
        return Page(errors=self._console_errors(), probe=probe)

    def evaluate(self, expression: str) -> Any:
        got = self._call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        if "exceptionDetails" in got:
            raise RuntimeError(f"the probe failed: {got['exceptionDetails']}")
        return got["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        """The whole page, as tall as its content, at the window's width, as a PNG at ``path``
        (the window keeps its height: a box sized by it stays as a reader sees it)."""
        metrics = self._call("Page.getLayoutMetrics", session=True)
        size = metrics["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        params = {"format": "png", "captureBeyondViewport": True, "clip": clip}
        shot = self._call("Page.captureScreenshot", params, session=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def _set_size(self, width: int, height: int) -> None:
        params = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        self._call("Emulation.setDeviceMetricsOverride", params, session=True)

    def _console_errors(self) -> list[str]:
        out = []
        for e in self._events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                out.append(
                    f"exception: {details.get('exception', {}).get('description') or details.get('text')}"
                )
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append(
                    "console: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
                )
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                out.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url', '')}".strip())
        return out

    def _call(
        self, method: str, params: dict[str, Any] | None = None, *, session: bool = False
    ) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._events.append(reply)

    def _wait_for(self, event: str) -> None:
        while not any(e.get("method") == event for e in self._events):
            self._events.append(self._read())

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT_S
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError(f"chromium said nothing for {TIMEOUT_S:g} s")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError(f"chromium closed its pipe (exit code {self._proc.poll()})")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)
