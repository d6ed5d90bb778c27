"""pyvalues: the Python objects Lightning keeps in checkpoint dicts, stored without pickle."""

from __future__ import annotations

import argparse
import dataclasses
import enum
import pathlib
import pickle
from collections import OrderedDict, namedtuple

import pytest
import torch
from lightning_fabric.utilities.data import AttributeDict

from trainstore.checkpoint import CheckpointManager
from trainstore.errors import UnsupportedTypeError
from trainstore.integrations import pyvalues


class Color(enum.Enum):
    RED = 1
    BLUE = "b"


@dataclasses.dataclass(frozen=True)
class Arch:
    width: int
    color: Color
    tags: tuple = ()


Point = namedtuple("Point", "x y")


class Opaque:
    def __init__(self, v: int) -> None:
        self.v = v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and other.v == self.v


def lightning_like() -> dict:
    """The kinds of values a real Lightning checkpoint dict holds (found by walking one)."""
    return {
        "global_step": 12, "epoch": 0, "pytorch-lightning_version": "2.6.6",
        "state_dict": OrderedDict([("net.0.weight", torch.arange(6.0).reshape(2, 3))]),
        "hyper_parameters": AttributeDict(lr=0.01, arch=Arch(16, Color.BLUE, ("a", 1)),
                                          opts=argparse.Namespace(note="tiny", depth=2, color=Color.RED),
                                          root=pathlib.Path("/data/x"), pure=pathlib.PureWindowsPath("C:/x"),
                                          ids={3, 1, 2}, frozen=frozenset({"a"}), pt=Point(1, 2.5)),
        "callbacks": {"ModelCheckpoint{'monitor': 'loss'}": {"best_k_models": {"/c/a.ckpt": torch.tensor(0.5)},
                                                             "best_model_score": torch.tensor(0.5)}},
        "user": {"$pyvalue": "not a tag", "nan": float("nan")},
        "hparams_name": "kwargs",
    }


def assert_same(a: object, b: object) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)) and not hasattr(a, "_fields"):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, float) and a != a:
        assert b != b
    elif isinstance(a, argparse.Namespace) or dataclasses.is_dataclass(a):
        assert_same(vars(a), vars(b))
    else:
        assert a == b


def test_round_trip_through_a_real_checkpoint(tmp_path):
    original = lightning_like()
    encoded = pyvalues.encode(original)
    assert encoded["hyper_parameters"]["$pyvalue"] == "mapping"
    assert encoded["user"]["$pyvalue"] == "dict"  # user data that looks like a tag is escaped
    with CheckpointManager(str(tmp_path / "store"), "job") as mgr:
        mgr.save(12, encoded, blocking=True)  # the core flattener accepts the encoded form
        restored = pyvalues.decode(mgr.restore())
    assert_same(original, restored)
    hp = restored["hyper_parameters"]
    assert isinstance(hp, AttributeDict) and hp.arch.color is Color.BLUE and hp.opts.color is Color.RED
    assert type(hp.root) is type(pathlib.Path("/")) and type(hp.pure) is pathlib.PureWindowsPath


def test_unsupported_leaf_names_its_path_and_the_opt_in():
    with pytest.raises(UnsupportedTypeError, match=r"hyper_parameters/model: .*Opaque.*allow_pickle_paths"):
        pyvalues.encode({"hyper_parameters": {"model": Opaque(3)}})
    with pytest.raises(UnsupportedTypeError, match=r"hyper_parameters: dict key"):
        pyvalues.encode({"hyper_parameters": {Color.RED: 1}})


def test_pickle_only_where_allowed_at_save_and_at_load(tmp_path):
    state = {"hyper_parameters": {"model": Opaque(3), "lr": 0.1}}
    encoded = pyvalues.encode(state, allow_pickle_paths=("hyper_parameters/*",))
    assert encoded["hyper_parameters"]["model"]["$pyvalue"] == "pickle"
    with CheckpointManager(str(tmp_path / "store"), "job") as mgr:
        mgr.save(1, encoded, blocking=True)
        stored = mgr.restore()
    with pytest.raises(UnsupportedTypeError, match=r"hyper_parameters/model: .*allow_pickle_paths"):
        pyvalues.decode(stored)  # the loader did not opt in
    with pytest.raises(UnsupportedTypeError):
        pyvalues.decode(stored, allow_pickle_paths=("other/*",))
    assert pyvalues.decode(stored, allow_pickle_paths=("hyper_parameters/model",)) == state


def test_decode_imports_nothing_and_calls_no_constructor():
    # a hostile record naming a callable that is not an Enum / dataclass / dict subclass
    for kind, cls in (("enum", "os:system"), ("dataclass", "subprocess:Popen"), ("mapping", "builtins:eval")):
        with pytest.raises(UnsupportedTypeError, match="is not"):
            pyvalues.decode({"x": {"$pyvalue": kind, "class": cls, "name": "a", "attrs": [], "items": []}})
    with pytest.raises(UnsupportedTypeError, match="not imported"):
        pyvalues.decode({"x": {"$pyvalue": "enum", "class": "no_such_module_xyz:Color", "name": "RED"}})
    blob = pickle.dumps(Opaque(1))
    with pytest.raises(UnsupportedTypeError, match="allow_pickle_paths"):
        pyvalues.decode({"x": {"$pyvalue": "pickle", "class": "m:Opaque", "data": blob}})
    with pytest.raises(UnsupportedTypeError, match="unknown value kind"):
        pyvalues.decode({"x": {"$pyvalue": "exec", "code": "1"}})


def test_dataclass_with_post_init_is_rebuilt_without_running_it():
    calls = []

    @dataclasses.dataclass
    class Counted:
        n: int

        def __post_init__(self) -> None:
            calls.append(self.n)

    Counted.__module__, Counted.__qualname__ = __name__, "Counted"
    globals()["Counted"] = Counted
    value = Counted(5)
    calls.clear()
    back = pyvalues.decode(pyvalues.encode({"c": value}))["c"]
    assert back == value and calls == []
