"""Issue 26 item 9: every temp file is created exclusively, under an unpredictable name, in
its target's directory (``fileio.create_temp``), so a symlink planted at a predictable temp
name never redirects a write. Each test plants the symlink an attacker sharing the directory
would (at the name the code used before), pointing at a victim file, and checks that the
victim is untouched and the target is a real, complete file."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from trainstore import fileio
from trainstore.fileio import TEMP_PREFIX, create_temp, create_temp_dir, replacing, write_atomic

SRC = Path(__file__).resolve().parents[2] / "src" / "trainstore"


def plant(link: str, tmp_path) -> Path:
    """A victim file and a symlink to it at ``link``; returns the victim."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    os.symlink(victim, link)
    return victim


def test_write_safetensors_ignores_symlinks_planted_at_the_old_temp_names(tmp_path):
    pytest.importorskip("safetensors")
    from trainstore.lifecycle.export import write_safetensors

    out = tmp_path / "out"
    out.mkdir()
    path = str(out / "model.safetensors")
    victim = plant(f"{path}.sha256.tmp", tmp_path)
    victim2 = tmp_path / "victim2.txt"
    victim2.write_text("also precious\n")
    os.symlink(victim2, f"{path}.tmp.{os.getpid()}")
    res = write_safetensors({"w": np.arange(8, dtype=np.float32)}, path, job="run", step=1)
    assert victim.read_text() == "precious\n" and victim2.read_text() == "also precious\n"
    assert not os.path.islink(path) and not os.path.islink(f"{path}.sha256")
    assert Path(f"{path}.sha256").read_text().split()[0] == res.sha256
    assert not [n for n in os.listdir(out) if n.startswith(TEMP_PREFIX)]


def test_wal_meta_and_journal_ignore_symlinks_planted_at_the_old_temp_names(tmp_path):
    from trainstore.data.ingest.wal import WriteAheadLog

    wal_dir = tmp_path / "wal"
    wal_dir.mkdir()
    victim = plant(str(wal_dir / "wal.json.tmp"), tmp_path)
    wal = WriteAheadLog(str(wal_dir), str(tmp_path / "store"), "ds")
    try:
        journal = wal._journal  # noqa: SLF001 - the journal's file name is the WAL's own business
        victim_j = tmp_path / "victim_j.txt"
        victim_j.write_text("journal victim\n")
        os.symlink(victim_j, journal + ".tmp")
        wal.reset_journal([], 5)
    finally:
        wal.close()
    assert victim.read_text() == "precious\n" and victim_j.read_text() == "journal victim\n"
    assert not os.path.islink(wal_dir / "wal.json") and not os.path.islink(journal)


def test_demo_report_ignores_a_symlink_planted_at_the_old_temp_name(tmp_path, monkeypatch):
    from trainstore.demo import report

    monkeypatch.setattr(report, "render_html", lambda run: "<html></html>")  # the page is not the point
    path = str(tmp_path / "report.html")
    victim = plant(f"{path}.tmp-{os.getpid()}", tmp_path)
    report.write_report({}, path)
    assert victim.read_text() == "precious\n"
    assert not os.path.islink(path) and Path(path).read_text() == "<html></html>"


def test_create_temp_never_opens_an_existing_name(tmp_path, monkeypatch):
    """Even a name collision (forced here) cannot make it write through a planted symlink."""
    monkeypatch.setattr(fileio.secrets, "token_hex", lambda n: "0" * (2 * n))
    victim = plant(str(tmp_path / (TEMP_PREFIX + "0" * 32 + ".x")), tmp_path)
    with pytest.raises(FileExistsError):
        create_temp(str(tmp_path), "x")
    with pytest.raises(FileExistsError):
        create_temp_dir(str(tmp_path), "x")
    assert victim.read_text() == "precious\n"


def test_temp_names_are_unpredictable_and_beside_the_target(tmp_path):
    names = set()
    for _ in range(50):
        fd, path = create_temp(str(tmp_path), "t")
        os.close(fd)
        assert os.path.dirname(path) == str(tmp_path)
        names.add(os.path.basename(path))
    assert len(names) == 50
    assert all(re.fullmatch(re.escape(TEMP_PREFIX) + r"[0-9a-f]{32}\.t", n) for n in names)


def test_replacing_leaves_the_target_untouched_on_error(tmp_path):
    path = tmp_path / "f"
    write_atomic(str(path), "old")
    with pytest.raises(RuntimeError), replacing(str(path)) as tmp:
        Path(tmp).write_text("half")
        raise RuntimeError("boom")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["f"]


def test_no_module_names_a_temp_file_itself():
    """A guard: temp names come from ``fileio`` only (the Lightning pointer writer makes its
    own with ``tempfile.mkstemp``, also exclusive and unpredictable)."""
    pattern = re.compile(r"""(\.tmp[.\-]?\{|\+ ?["']\.tmp|\.tmp\.\{os\.getpid|["']\.tmp["'])""")
    allowed = {"fileio.py", "lightning_pointers.py"}
    offenders = []
    for file in SRC.rglob("*.py"):
        if file.name in allowed:
            continue
        for n, line in enumerate(file.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{file.relative_to(SRC)}:{n}: {line.strip()}")
    assert not offenders, "temp files must come from trainstore.fileio.create_temp:\n" + "\n".join(offenders)


def test_the_wal_removes_temp_files_a_crash_left_behind(tmp_path):
    from trainstore.data.ingest.wal import WriteAheadLog

    wal_dir = tmp_path / "wal"
    wal_dir.mkdir()
    leftover = wal_dir / (TEMP_PREFIX + "0" * 32 + ".uploaded.jsonl")
    leftover.write_text("half a journal")
    WriteAheadLog(str(wal_dir), str(tmp_path / "store"), "ds").close()
    assert not leftover.exists()
    assert not [n for n in os.listdir(wal_dir) if n.startswith(TEMP_PREFIX)]
