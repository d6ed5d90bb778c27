"""A small Chrome DevTools Protocol client (aiohttp websocket) for the report browser test.

Starts headless Chromium on 127.0.0.1 with an ephemeral debugging port, opens one page,
collects console errors and uncaught exceptions, evaluates expressions, takes screenshots.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import time
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"]


class Browser:
    def __init__(self, chromium: str, user_data_dir: str) -> None:
        self.proc = subprocess.Popen([chromium, *FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.ws_url = self._devtools_url()

    def _devtools_url(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"chromium exited with {self.proc.returncode}")
                continue
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                return m.group(1)
        raise TimeoutError("chromium did not start its DevTools endpoint")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


async def inspect_page(ws_url: str, url: str, expression: str, screenshot_width: int = 1100,
                       timeout: float = 60.0) -> dict[str, Any]:
    """Load ``url`` in a new page; return console errors, exceptions, ``expression``'s value and a
    full-page PNG screenshot."""
    import aiohttp

    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url, max_msg_size=0) as ws:
        ids = iter(range(1, 1 << 30))
        pending: dict[int, asyncio.Future] = {}
        events: list[dict] = []
        loaded = asyncio.Event()

        async def reader() -> None:
            async for msg in ws:
                data = json.loads(msg.data)
                if "id" in data and data["id"] in pending:
                    pending.pop(data["id"]).set_result(data)
                else:
                    events.append(data)
                    if data.get("method") == "Page.loadEventFired":
                        loaded.set()

        task = asyncio.create_task(reader())

        async def call(method: str, session: str | None = None, **params: Any) -> dict:
            i = next(ids)
            fut = asyncio.get_running_loop().create_future()
            pending[i] = fut
            msg: dict[str, Any] = {"id": i, "method": method, "params": params}
            if session:
                msg["sessionId"] = session
            await ws.send_str(json.dumps(msg))
            res = await asyncio.wait_for(fut, timeout)
            if "error" in res:
                raise RuntimeError(f"{method}: {res['error']}")
            return res.get("result", {})

        target = (await call("Target.createTarget", url="about:blank"))["targetId"]
        session = (await call("Target.attachToTarget", targetId=target, flatten=True))["sessionId"]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            await call(domain, session)
        await call("Emulation.setDeviceMetricsOverride", session, width=screenshot_width, height=900,
                   deviceScaleFactor=1, mobile=False)
        await call("Page.navigate", session, url=url)
        await asyncio.wait_for(loaded.wait(), timeout)
        await asyncio.sleep(0.3)  # let the post-load check script run
        value = (await call("Runtime.evaluate", session, expression=expression, returnByValue=True))["result"]
        height = (await call("Runtime.evaluate", session, expression="document.documentElement.scrollHeight",
                             returnByValue=True))["result"]["value"]
        await call("Emulation.setDeviceMetricsOverride", session, width=screenshot_width, height=int(height),
                   deviceScaleFactor=1, mobile=False)
        shot = await call("Page.captureScreenshot", session, format="png", captureBeyondViewport=True)
        task.cancel()
    errors = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description")))
                                                                   for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            errors.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            errors.append("log: " + p["entry"].get("text", ""))
    return {"errors": errors, "value": value.get("value"), "png": base64.b64decode(shot["data"]),
            "events": len(events)}
