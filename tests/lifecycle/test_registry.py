"""Model registry: versions with lineage, aliases, rollback, concurrent writers."""

from __future__ import annotations

import threading

import pytest

from trainstore import Registry, open_store
from trainstore.errors import ConfigError, ConflictError, NotFoundError

from .helpers import NOW, make_ckpt


@pytest.fixture
def store(tmp_path):
    s = open_store(str(tmp_path / "s"))
    for step in (10, 20, 30):
        make_ckpt(s, "run", step, created=NOW, metrics={"val_loss": 1.0 / step})
    yield s
    s.close()


def test_register_lineage_and_latest(store):
    reg = Registry(store)
    v1 = reg.register("run", 10, "llm", dataset="tokens@3", config={"lr": 0.1}, note="first")
    assert (v1.version, v1.job, v1.step, v1.dataset, v1.note) == (1, "run", 10, "tokens@3", "first")
    assert v1.metrics == {"val_loss": 0.1} and v1.config == {"lr": 0.1}
    assert len(v1.checkpoint_id) == 64
    v2 = reg.register("run", 20, "llm", metrics={"bleu": 31.0})
    assert v2.version == 2 and v2.metrics == {"val_loss": 0.05, "bleu": 31.0}
    assert reg.get("llm").version == 2 and reg.get("llm@latest").version == 2 and reg.get("llm@1").step == 10
    assert reg.models() == ["llm"]
    assert [v.version for v in reg.versions("llm")] == [1, 2]
    assert reg.protected_steps("run") == {10: "registered as llm@1", 20: "registered as llm@2 (latest)"}


def test_alias_set_move_rollback_promote(store):
    reg = Registry(store)
    for step in (10, 20, 30):
        reg.register("run", step, "llm", aliases=())
    reg.promote("llm", 1)
    assert reg.aliases("llm") == {"stable": 1}
    reg.promote("llm", 2)
    assert reg.aliases("llm") == {"stable": 2, "fallback": 1}
    reg.rollback("llm", "stable")  # stable -> fallback
    assert reg.aliases("llm")["stable"] == 1
    reg.rollback("llm", "stable", to=None)  # undo: back to its previous target
    assert reg.aliases("llm")["stable"] == 2
    reg.set_alias("llm", "canary", 3)
    reg.set_alias("llm", "canary", 1)
    assert [e.version for e in reg.history("llm", "canary")] == [3, 1]
    reg.remove_alias("llm", "canary")
    assert "canary" not in reg.aliases("llm")
    with pytest.raises(NotFoundError, match="no alias 'canary'"):
        reg.get("llm@canary")


def test_bad_input(store):
    reg = Registry(store)
    with pytest.raises(NotFoundError, match="no model 'nope'"):
        reg.get("nope@stable")
    with pytest.raises(NotFoundError, match="no checkpoint step 99"):
        reg.register("run", 99, "llm")
    reg.register("run", 10, "llm")
    with pytest.raises(NotFoundError, match="no version 7"):
        reg.set_alias("llm", "stable", 7)
    with pytest.raises(NotFoundError, match="no alias 'stable'"):
        reg.get("llm@stable")
    with pytest.raises(ConfigError):
        reg.set_alias("llm", "../x", 1)
    with pytest.raises(NotFoundError, match="no previous target"):
        reg.rollback("llm", "latest", to=None)


def test_compare_and_set(store):
    reg = Registry(store)
    reg.register("run", 10, "llm", aliases=("stable",))
    reg.register("run", 20, "llm", aliases=())
    reg.set_alias("llm", "stable", 2, expect=1)
    with pytest.raises(ConflictError, match="expected 1"):
        reg.set_alias("llm", "stable", 1, expect=1)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["local", "s3"])
def test_concurrent_alias_moves_and_registrations(tmp_path, backend, request):
    if backend == "local":
        store = open_store(str(tmp_path / "c"))
    else:
        url, opts = request.getfixturevalue("s3_url")
        store = open_store(url, **opts)
    make_ckpt(store, "run", 1, created=NOW)
    reg = Registry(store)
    n_threads, per_thread = 6, 4
    errors: list[BaseException] = []
    registered: list[int] = []
    cas_wins: list[int] = []

    def worker(i: int) -> None:
        try:
            r = Registry(store)
            for _ in range(per_thread):
                mv = r.register("run", 1, "llm", aliases=())
                registered.append(mv.version)
                r.set_alias("llm", "latest", mv.version)
                # compare-and-set increments of a counter alias: exactly one winner per value
                while True:
                    seq, cur = r._head("llm", "counter")
                    nxt = (cur or 0) + 1
                    try:
                        r.set_alias("llm", "counter", nxt, expect=cur)
                        cas_wins.append(nxt)
                        break
                    except ConflictError:
                        continue
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    total = n_threads * per_thread
    assert sorted(registered) == list(range(1, total + 1))  # every registration got its own number
    hist = reg.history("llm", "latest")
    assert sorted(e.version for e in hist) == list(range(1, total + 1))  # no move lost
    assert [e.seq for e in hist] == list(range(1, total + 1))
    for prev, ev in zip(hist, hist[1:]):
        assert ev.previous == prev.version  # a linear history: each move saw the one before
    assert sorted(cas_wins) == list(range(1, total + 1))  # CAS: each value won exactly once
    assert reg.aliases("llm")["counter"] == total
    store.close()
