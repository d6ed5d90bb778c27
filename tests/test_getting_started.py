"""Every code block of docs/getting-started.md runs (issue 29 item 1): each ``## `` section
becomes one bash script in an empty folder (```bash blocks verbatim, consecutive ```python blocks
as one ``python -`` process), run with the project's virtualenv first on PATH."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from trainstore.testing.s3server import free_port

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "getting-started.md")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def sections() -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for part in open(DOC, encoding="utf-8").read().split("\n## ")[1:]:
        title = part.splitlines()[0].strip()
        blocks = [(lang, code) for lang, code in BLOCK.findall(part)]
        if blocks:
            out[title] = blocks
    return out


def script(blocks: list[tuple[str, str]]) -> str:
    lines = ["set -euo pipefail"]
    python: list[str] = []
    for lang, code in [*blocks, ("end", "")]:
        if lang == "python":
            python.append(code)
            continue
        if python:
            lines += ["python - <<'TRAINSTORE_DOC_PY'", "\n".join(python), "TRAINSTORE_DOC_PY"]
            python = []
        if lang == "bash":
            lines.append(code)
        elif lang not in ("end", ""):
            raise AssertionError(f"unexpected code block language {lang!r} in getting-started.md")
    return "\n".join(lines) + "\n"


SECTIONS = sections()


def test_the_page_has_the_recipes():
    titles = " / ".join(SECTIONS)
    for word in ("PyTorch loop", "Parquet", "Hugging Face", "Lightning", "object store"):
        assert word in titles, titles
    assert all(lang in ("python", "bash") for blocks in SECTIONS.values() for lang, _ in blocks)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("title", list(SECTIONS), ids=lambda t: t.split(".")[0])
def test_section_runs(title, tmp_path):
    if "Hugging Face" in title:
        pytest.importorskip("transformers")
    if "Lightning" in title:
        pytest.importorskip("pytorch_lightning")
    text = script(SECTIONS[title])
    if "object store" in title:
        text = text.replace("9000", str(free_port()))  # the page's port may be taken here
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
           "COLUMNS": "100", "PYTHONWARNINGS": "ignore"}
    env = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    runs = 2 if title.startswith("1.") else 1  # section 1 says: run it twice, the second resumes
    for _ in range(runs):
        proc = subprocess.Popen(["bash", "-c", text], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=280)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the S3 server the section started in the background
            except ProcessLookupError:
                pass
        assert proc.returncode == 0, f"section {title!r} failed:\n{out[-4000:]}"
    if title.startswith("1."):
        assert "resumed from" in out, out[-2000:]
