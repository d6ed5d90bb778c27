"""Transform resume keys: a re-run reuses shards only when the function, what it calls, its
kwargs, the library versions and ``version=`` are unchanged; functions defined where users
write them (lambdas, closures, ``__main__``) run in-process and on the process pool."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from trainstore.data.transforms import transform
from trainstore.data.transforms.fn_identity import fn_fingerprint
from trainstore.data.versions import list_versions, load_version
from trainstore.errors import ConfigError

from .xf_support import ROWS, SHARDS, column, small_dataset


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """A folder on sys.path for modules the test writes; returns write(stem, source) -> module.
    Names are unique per test; bytecode is not cached, so an edit is always seen on reload."""
    folder = tmp_path / "mods"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    suffix = uuid.uuid4().hex[:8]
    names = []

    def write(stem: str, source: str):
        name = f"{stem}_{suffix}"
        (folder / f"{name}.py").write_text(textwrap.dedent(source).replace("SUFFIX", suffix))
        importlib.invalidate_caches()
        names.append(name)
        if name in sys.modules:
            return importlib.reload(sys.modules[name])
        return importlib.import_module(name)

    yield write
    for name in names:
        sys.modules.pop(name, None)


def _calls(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_editing_a_helper_module_recomputes_and_an_unchanged_rerun_reuses(tmp_path, user_modules):
    store = small_dataset(tmp_path)
    calls = tmp_path / "calls.txt"
    helper_src = """
        FACTOR = {factor}
        def scale(col):
            import pyarrow.compute as pc
            return pc.multiply(col, FACTOR)
    """
    user_modules("xf_helper", helper_src.format(factor=3))
    fn_module = user_modules("xf_fn", f"""
        import pyarrow as pa
        import xf_helper_SUFFIX as helper
        def scaled(batch):
            with open({str(calls)!r}, "a") as f:  # one line per call: the tests count them
                f.write("call\\n")
            return pa.RecordBatch.from_arrays([helper.scale(batch.column("id"))], names=["y"])
    """)
    first = transform(store, "nums", fn_module.scaled, output="out")
    assert _calls(calls) == SHARDS and first.extra["resumed_shards"] == 0
    assert column(store, first, "y") == [3 * i for i in range(ROWS)]

    again = transform(store, "nums", fn_module.scaled, output="out")  # nothing changed: reuse
    assert _calls(calls) == SHARDS and again.extra["resumed_shards"] == SHARDS
    assert [s.key for s in again.shards] == [s.key for s in first.shards]

    user_modules("xf_helper", helper_src.format(factor=17))  # edit the helper only
    edited = transform(store, "nums", fn_module.scaled, output="out")
    assert _calls(calls) == 2 * SHARDS and edited.extra["resumed_shards"] == 0
    assert column(store, edited, "y") == [17 * i for i in range(ROWS)]

    bumped = transform(store, "nums", fn_module.scaled, output="out", version=2)
    assert _calls(calls) == 3 * SHARDS and bumped.extra["resumed_shards"] == 0
    assert bumped.config["version"] == 2
    assert bumped.config["libraries"]["pyarrow"] == pa.__version__
    assert list_versions(store, "out") == [1, 2, 3, 4]


def test_fingerprint_sees_helpers_imported_by_name_and_module_constants(user_modules):
    src = """
        LIMIT = {limit}
        def clip(col):
            return min(col, LIMIT)
    """
    user_modules("xf_named", src.format(limit=5))
    fn_module = user_modules("xf_user", """
        from xf_named_SUFFIX import clip
        def fn(batch, k=1):
            return clip(batch) * k
    """)
    before = fn_fingerprint(fn_module.fn)
    assert fn_fingerprint(fn_module.fn) == before  # stable within a process
    user_modules("xf_named", src.format(limit=6))
    fn_module = user_modules("xf_user", """
        from xf_named_SUFFIX import clip
        def fn(batch, k=1):
            return clip(batch) * k
    """)
    assert fn_fingerprint(fn_module.fn) != before


def test_a_module_edited_on_disk_but_not_reloaded_is_refused(tmp_path, user_modules):
    store = small_dataset(tmp_path)
    src = """
        import pyarrow as pa
        import pyarrow.compute as pc
        def fn(batch):
            return pa.RecordBatch.from_arrays([pc.multiply(batch.column("id"), {k})], names=["y"])
    """
    module = user_modules("xf_stale", src.format(k=2))
    with open(module.__file__, "w") as f:  # edited, not reloaded: the old code would run
        f.write(textwrap.dedent(src.format(k=5)))
    with pytest.raises(ConfigError, match=r"xf_stale_\w+:fn differs from .*xf_stale_\w+\.py on disk"):
        transform(store, "nums", module.fn, output="stale")
    module = user_modules("xf_stale", src.format(k=5))  # reloaded: runs, with the new code
    done = transform(store, "nums", module.fn, output="stale")
    assert column(store, done, "y") == [5 * i for i in range(ROWS)]


def _times(k):
    def times(batch):
        return pa.RecordBatch.from_arrays([pc.multiply(batch.column("id"), k)], names=["y"])
    return times


def test_lambda_and_closure_run_on_the_process_pool_and_a_new_captured_value_recomputes(tmp_path):
    store = small_dataset(tmp_path)
    lam = transform(store, "nums", lambda b: pa.RecordBatch.from_arrays([pc.negate(b.column("id"))], names=["y"]),
                    output="lam", workers=2)
    assert column(store, lam, "y") == [-i for i in range(ROWS)]

    three = transform(store, "nums", _times(3), output="clo", workers=2)
    assert column(store, three, "y") == [3 * i for i in range(ROWS)] and three.extra["resumed_shards"] == 0
    same = transform(store, "nums", _times(3), output="clo")  # a new closure, same value: reuse
    assert same.extra["resumed_shards"] == SHARDS
    four = transform(store, "nums", _times(4), output="clo")
    assert four.extra["resumed_shards"] == 0 and column(store, four, "y") == [4 * i for i in range(ROWS)]


MAIN_SCRIPT = """
import json, sys
import pyarrow as pa
import pyarrow.compute as pc
from trainstore.data.transforms import transform

OFFSET = 1000

def shifted(batch):
    return pa.RecordBatch.from_arrays([pc.add(batch.column("id"), OFFSET)], names=["y"])

if __name__ == "__main__":
    v = transform(sys.argv[1], "nums", shifted, output="main", workers=2)
    print(json.dumps({"resumed": v.extra["resumed_shards"], "version": v.version}))
"""


@pytest.mark.timeout(120)
def test_function_defined_in_a_main_script_runs_on_the_process_pool_and_resumes_across_runs(tmp_path):
    store = small_dataset(tmp_path)
    script = tmp_path / "job.py"
    script.write_text(MAIN_SCRIPT)
    runs = []
    for _ in range(2):  # two processes: the key must not depend on hash randomisation
        out = subprocess.run([sys.executable, str(script), store.url], capture_output=True, text=True,
                             timeout=100)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs == [{"resumed": 0, "version": 1}, {"resumed": SHARDS, "version": 2}]
    assert column(store, load_version(store, "main", 2), "y") == [1000 + i for i in range(ROWS)]
