"""What a transform function *is*, for resume keys, and how it travels to workers.

``fn_fingerprint(fn)`` is a BLAKE3 digest of everything that decides what ``fn`` computes, so
a transform re-run reuses old shards only when none of it changed:

* the code objects (bytecode, constants, names; nested code recursively; not line numbers),
  defaults and closure cells of ``fn``;
* the globals its code names, by value: numbers, strings, containers and picklable objects
  by content; user functions and classes recursively (so editing a helper is seen); library
  modules and functions by distribution name and version;
* the file content of every user module involved (the one defining ``fn`` and those of the
  helpers and modules it references). A module is "user" when it lives outside the Python
  installation and site-packages; library code is keyed by its version instead.

A value that cannot be serialised keys as a fresh random nonce: such a function is always
recomputed rather than ever reusing stale output. A user function whose module file changed on
disk after it was imported is refused (``ConfigError``): the key would name the new file while
the old code runs.

``ship_fn(fn)``: a function that workers cannot import (defined in ``__main__`` or a notebook,
a lambda, a closure) is serialised with cloudpickle, only to send the caller's own function
to the caller's own workers. Stored data never contains pickles and reading never unpickles.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import pickle
import secrets
import sys
import sysconfig
import types
from collections.abc import Callable
from typing import Any

import blake3

from ...errors import ConfigError

try:
    import cloudpickle
except ImportError:  # optional: only needed to ship non-importable functions to other processes
    cloudpickle = None


@functools.cache
def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= {p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))}
    return tuple(sorted(os.path.realpath(r) + os.sep for r in roots))


def _is_library(module: types.ModuleType) -> bool:
    """Builtin, standard library or site-packages (keyed by version); else user code."""
    if module.__name__.partition(".")[0] in sys.builtin_module_names:
        return True
    path = getattr(module, "__file__", None)
    return bool(path) and module_file(module) is None


def module_file(module: types.ModuleType | None) -> str | None:
    """The real path of a user module's source file, or None (library, builtin, no file)."""
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py") or not os.path.isfile(path):
        return None
    path = os.path.realpath(path)
    return None if path.startswith(_library_roots()) else path


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


@functools.cache
def _library_version(top: str) -> str:
    if top in sys.stdlib_module_names or top == "builtins":
        return f"python {sys.version_info.major}.{sys.version_info.minor}"
    for dist in _distributions().get(top, []):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def _file_digest(path: str) -> str:
    with open(path, "rb") as f:
        return blake3.blake3(f.read()).hexdigest()


class _Fingerprinter:
    """Walks a function and what it references; ``files`` collects user module files."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self._seen: dict[int, tuple[Any, str]] = {}

    def module(self, module: types.ModuleType) -> str:
        if _is_library(module):
            return f"module {module.__name__} ({_library_version(module.__name__.partition('.')[0])})"
        self._add_file(module)
        return f"module {module.__name__} (user)"

    def _add_file(self, module: types.ModuleType) -> None:
        # __main__ (a script, a notebook) is keyed by the code it defines, not its whole file
        path = module_file(module)
        if path is not None and module.__name__ not in ("__main__", "__mp_main__"):
            self.files.add(path)

    def code(self, code: types.CodeType) -> str:
        parts = [code.co_code.hex(), repr(code.co_names), repr(code.co_varnames)]
        parts += [self.value(c) for c in code.co_consts]
        return "code(" + ",".join(parts) + ")"

    def function(self, fn: types.FunctionType) -> str:
        name = f"fn {fn.__module__}:{fn.__qualname__}"
        module = sys.modules.get(fn.__module__ or "")
        if module is not None:
            if _is_library(module):
                return f"{name} ({self.module(module)})"
            self._add_file(module)
            _check_current(fn, module)
        names = _referenced_names(fn.__code__)
        parts = [
            name, self.code(fn.__code__), self.value(fn.__defaults__), self.value(fn.__kwdefaults__),
            self.value(tuple(_cell(c) for c in fn.__closure__ or ())),
            self.value({n: fn.__globals__[n] for n in sorted(names) if n in fn.__globals__}),
        ]
        return "(" + ",".join(parts) + ")"

    def cls(self, cls: type) -> str:
        name = f"class {cls.__module__}:{cls.__qualname__}"
        module = sys.modules.get(cls.__module__ or "")
        if module is None or _is_library(module):
            return f"{name} ({_library_version((cls.__module__ or '').partition('.')[0])})"
        self._add_file(module)
        members = {k: v for k, v in vars(cls).items()
                   if not k.startswith("__") or k in ("__init__", "__call__")}
        return name + self.value(members) + self.value(cls.__bases__)

    def value(self, v: Any) -> str:
        if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
            return f"{type(v).__name__}:{v!r}"
        key = id(v)
        if key in self._seen:  # the entry keeps v alive, so its id is not reused meanwhile
            return self._seen[key][1] or "<cycle>"
        self._seen[key] = (v, "")
        out = self._value(v)
        self._seen[key] = (v, out)
        return out

    def _value(self, v: Any) -> str:
        if isinstance(v, types.CodeType):
            return self.code(v)
        if isinstance(v, types.FunctionType):
            return self.function(v)
        if isinstance(v, types.ModuleType):
            return self.module(v)
        if isinstance(v, type):
            return self.cls(v)
        if isinstance(v, (types.BuiltinFunctionType, types.MethodType, functools.partial)):
            return self._callable(v)
        if isinstance(v, (tuple, list)):
            return f"{type(v).__name__}[" + ",".join(self.value(x) for x in v) + "]"
        if isinstance(v, (set, frozenset)):
            return f"{type(v).__name__}{{" + ",".join(sorted(self.value(x) for x in v)) + "}"
        if isinstance(v, dict):
            items = sorted((self.value(k), self.value(x)) for k, x in v.items())
            return "dict{" + ",".join(f"{k}:{x}" for k, x in items) + "}"
        return f"{self.value(type(v))}={self._pickled(v)}"  # the class's code, and the state

    def _callable(self, v: Any) -> str:
        if isinstance(v, functools.partial):
            return f"partial({self.value(v.func)},{self.value(v.args)},{self.value(v.keywords)})"
        if isinstance(v, types.MethodType):
            return f"method({self.value(v.__func__)},{self._pickled(v.__self__)})"
        top = (getattr(v, "__module__", None) or "builtins").partition(".")[0]
        return f"builtin {getattr(v, '__module__', '')}:{v.__qualname__} ({_library_version(top)})"

    def _pickled(self, v: Any) -> str:
        try:
            data = (cloudpickle or pickle).dumps(v, protocol=5)
        except Exception:  # noqa: BLE001 - anything unpicklable: never reuse, see module docstring
            return f"unserialisable {type(v).__qualname__} {secrets.token_hex(8)}"
        return f"{type(v).__qualname__}:{blake3.blake3(data).hexdigest()}"


def _plain_code(code: types.CodeType) -> tuple:
    """Bytecode, names and constants (nested code recursively): what two compilations of the
    same source agree on."""
    consts = tuple(_plain_code(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts)
    return code.co_code, code.co_names, consts


def _codes_named(code: types.CodeType, qualname: str) -> list[types.CodeType]:
    out = []
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_qualname == qualname:
                out.append(const)
            out += _codes_named(const, qualname)
    return out


def _check_current(fn: types.FunctionType, module: types.ModuleType) -> None:
    """Refuse a function whose module file changed on disk after it was imported: the key
    would name the new file while the old code runs (stale shards under the new key)."""
    path = module_file(module)
    code = fn.__code__
    if path is None or os.path.realpath(code.co_filename) != path:
        return
    with open(path, "rb") as f:
        source = f.read()
    try:
        on_disk = _codes_named(compile(source, path, "exec", dont_inherit=True), code.co_qualname)
    except SyntaxError:
        on_disk = []
    if _plain_code(code) not in [_plain_code(c) for c in on_disk]:
        raise ConfigError(
            f"{fn.__module__}:{fn.__qualname__} differs from {path} on disk (the file changed "
            "after it was imported): reload the module (importlib.reload) or restart, so the "
            "code that runs is the code the resume key names"
        )


def _cell(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a closure variable not assigned yet)
        return None


def _referenced_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _referenced_names(const)
    return names


def library_versions() -> dict[str, str]:
    """Versions of the libraries every transform's output depends on."""
    out = {"python": f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"}
    for dist in ("trainstore", "pyarrow", "numpy"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "unknown"
    return out


def fn_fingerprint(fn: Callable[..., Any]) -> str:
    """BLAKE3 hex of what ``fn`` computes (see the module docstring)."""
    walker = _Fingerprinter()
    described = walker.value(fn)
    files = []
    for path in sorted(walker.files):
        files.append(f"{path}:{_file_digest(path)}")
    return blake3.blake3("\n".join([described, *files]).encode()).hexdigest()


def fn_name(fn: Callable[..., Any]) -> str:
    """``module:qualname`` for messages and the version's config."""
    return f"{getattr(fn, '__module__', None) or '?'}:{getattr(fn, '__qualname__', type(fn).__name__)}"


def importable_ref(fn: Callable[..., Any]) -> str | None:
    """``module:qualname`` when workers can import ``fn`` back to this same object, else None."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return None
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return f"{module}:{qualname}" if obj is fn else None


def ship_fn(fn: Callable[..., Any]) -> bytes:
    """cloudpickle bytes of a non-importable ``fn``, for the caller's own worker processes."""
    if cloudpickle is None:
        raise ConfigError(
            f"transform function {fn_name(fn)} is not importable by worker processes and "
            "cloudpickle is not installed: pip install 'trainstore[data]', use workers=1, or "
            "define it at the top level of a module"
        )
    try:
        return cloudpickle.dumps(fn, protocol=5)
    except Exception as exc:  # noqa: BLE001 - report what could not be shipped
        raise ConfigError(
            f"transform function {fn_name(fn)} cannot be sent to worker processes "
            f"({type(exc).__name__}: {exc}); use workers=1 or define it at the top level of a module"
        ) from None


def load_shipped(blob: bytes) -> Callable[..., Any]:
    """The function ``ship_fn`` serialised (runs in a worker, on bytes its own caller made)."""
    try:
        return pickle.loads(blob)
    except Exception as exc:  # noqa: BLE001 - e.g. a module the function needs is missing here
        raise ConfigError(f"the transform function sent to this worker does not load here: "
                          f"{type(exc).__name__}: {exc}") from None
