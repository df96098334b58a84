"""Headless Chromium driven over the DevTools protocol, with every non-local request blocked.

Used by tests/test_docs.py to look at built pages as a reader's browser shows them, offline.
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

#: Flags of a quiet, offline, throw-away browser; the proxy and resolver rules make every
#: request that is not to 127.0.0.1 fail (loopback bypasses the proxy).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--proxy-server=http://127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                  "--remote-allow-origins=*", "--remote-debugging-port=0"]

#: Runs in the page: waits for the load event, MathJax and image decoding, then reports.
PAGE_REPORT = """(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  const images = [...document.images];
  await Promise.all(images.map(i => i.decode().catch(() => null)));
  return JSON.stringify({
    text: document.body.innerText,
    mathjax: !!(window.MathJax && MathJax.version),
    formulas: document.querySelectorAll('mjx-container').length,
    untypeset: document.querySelectorAll('.math:not(:has(mjx-container))').length,
    images: images.map(i => [i.getAttribute('src'), i.complete && i.naturalWidth > 0]),
  });
})()"""


def chromium_binary() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextmanager
def serve(folder: Path):
    """Serve ``folder`` on 127.0.0.1 (a free port); yields the base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Browser:
    """One headless Chromium tab; :meth:`report` loads a page and returns :data:`PAGE_REPORT`'s answer
    plus ``failed``: the local URLs the page could not load."""

    def __init__(self, binary: str, timeout: float = 60.0):
        import websocket

        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="sinkflow-chromium-")
        self.proc = subprocess.Popen([binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = self._devtools_port()
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout))
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout, suppress_origin=True)
        self._id = 0
        self._events: list[dict] = []
        self.send("Page.enable")
        self.send("Network.enable")

    def _devtools_port(self) -> int:
        marker = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if marker.exists() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with code {self.proc.returncode}")
            time.sleep(0.1)
        raise TimeoutError("chromium did not open its DevTools port")

    def send(self, method: str, **params) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._events.append(msg)

    def _wait_event(self, name: str) -> None:
        while not any(e.get("method") == name for e in self._events):
            self._events.append(json.loads(self.ws.recv()))

    def report(self, url: str) -> dict:
        self._events.clear()
        self.send("Page.navigate", url=url)
        self._wait_event("Page.loadEventFired")
        result = self.send("Runtime.evaluate", expression=PAGE_REPORT, awaitPromise=True, returnByValue=True)
        out = json.loads(result["result"]["value"])
        requested = {e["params"]["requestId"]: e["params"]["request"]["url"]
                     for e in self._events if e.get("method") == "Network.requestWillBeSent"}
        out["failed"] = [requested.get(e["params"]["requestId"], "?") for e in self._events
                         if e.get("method") == "Network.loadingFailed"
                         and requested.get(e["params"]["requestId"], "").startswith("http://127.0.0.1")
                         # the browser's own
                         and not requested.get(e["params"]["requestId"], "").endswith("/favicon.ico")]
        return out

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)
