"""Open the demo's report in headless Chromium: no console errors, every plot rendered, and a
screenshot (saved to docs/report-screenshot.png for the README when
TRAINSTORE_UPDATE_SCREENSHOT=1)."""

from __future__ import annotations

import asyncio
import os
import shutil

import pytest
from conftest import require_program  # tests/conftest.py: optional dependencies

from trainstore.demo.report import PLOTS

from .conftest import chromium_path

pytestmark = pytest.mark.timeout(240)
SCREENSHOT = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "report-screenshot.png")

CHECK = """JSON.stringify({
  status: document.getElementById('plot-status').getAttribute('data-ok'),
  text: document.body.innerText,
  lineage: Array.from(document.querySelectorAll('#plot-lineage text')).map(e => e.textContent).join(' | '),
  plots: Array.from(document.querySelectorAll('svg.plot')).map(e => {
    const b = e.getBoundingClientRect();
    return {id: e.id, rendered: e.getAttribute('data-rendered'), marks: e.querySelectorAll('.mark').length,
            width: b.width, height: b.height};
  }),
  external: Array.from(document.querySelectorAll('[src],[href]')).map(e => e.getAttribute('src') || e.getAttribute('href'))
})"""


def test_report_renders_in_chromium(demo_run, tmp_path):
    import json

    chromium = require_program("chromium", chromium_path(), install="apt-get install chromium (make chromium)")
    from .cdp import Browser, inspect_page

    browser = Browser(chromium, str(tmp_path / "profile"))
    try:
        result = asyncio.run(inspect_page(browser.ws_url, "file://" + demo_run["report"], CHECK))
    finally:
        browser.close()
    assert result["errors"] == []
    page = json.loads(result["value"])
    assert page["status"] == "yes"
    assert "plots rendered" not in page["text"] and "scripts off" not in page["text"]  # no self-check text
    assert "\u2026" not in page["lineage"] and "status" in page["text"]  # labels whole; checkpoint status column
    assert [p["id"] for p in page["plots"]] == list(PLOTS)
    for p in page["plots"]:
        assert p["rendered"] == "yes" and p["marks"] >= 3 and p["width"] > 300 and p["height"] > 100, p
    assert all(not ref.startswith(("http:", "https:", "//")) for ref in page["external"]), page["external"]
    png = result["png"]
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    shot = tmp_path / "report.png"
    shot.write_bytes(png)
    if os.environ.get("TRAINSTORE_UPDATE_SCREENSHOT") == "1":  # refresh the README's picture
        os.makedirs(os.path.dirname(SCREENSHOT), exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)


def test_broken_page_is_caught(demo_run, tmp_path):
    """The check can fail: a page with a script error and a missing plot is reported."""
    chromium = require_program("chromium", chromium_path(), install="apt-get install chromium (make chromium)")
    from .cdp import Browser, inspect_page

    html = open(demo_run["report"], encoding="utf-8").read()
    broken = html.replace('id="plot-lineage"', 'id="plot-gone"').replace("</main>", "<script>nope();</script></main>")
    page = tmp_path / "broken.html"
    page.write_text(broken, encoding="utf-8")
    browser = Browser(chromium, str(tmp_path / "profile"))
    try:
        result = asyncio.run(inspect_page(browser.ws_url, f"file://{page}", CHECK))
    finally:
        browser.close()
    text = "\n".join(result["errors"])
    assert "plot missing: plot-lineage" in text and "nope" in text
