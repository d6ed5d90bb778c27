"""One base for the options of every sweep (``trainstore.sweeps.SweepOptions``): the chunk GC
and the data GC share its fields, parsing and validation; each adds only its own."""

from __future__ import annotations

import dataclasses

import pytest

from trainstore.data.gc import DataGcOptions
from trainstore.errors import ConfigError
from trainstore.lifecycle.gc import GcOptions
from trainstore.sweeps import SweepOptions

SHARED = {"grace", "max_duration", "heartbeat", "marker_ttl", "workers", "batch", "ignore_unreadable"}


@pytest.mark.parametrize("cls", [GcOptions, DataGcOptions])
def test_both_collectors_share_the_base(cls):
    assert issubclass(cls, SweepOptions)
    own = {f.name for f in dataclasses.fields(cls)} - SHARED
    assert own == ({"lease_ttl"} if cls is GcOptions else set())
    opts = cls(grace="2h", max_duration="30m", heartbeat="5s", marker_ttl="1d")
    assert (opts.grace, opts.max_duration, opts.heartbeat, opts.marker_ttl) == (7200.0, 1800.0, 5.0, 86400.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.grace = 0  # type: ignore[misc]


@pytest.mark.parametrize("cls", [GcOptions, DataGcOptions])
@pytest.mark.parametrize("bad, field", [({"heartbeat": 0}, "heartbeat"), ({"workers": 0}, "workers"),
                                        ({"batch": True}, "batch"), ({"grace": "soon"}, "grace")])
def test_shared_validation_names_the_field(cls, bad, field):
    with pytest.raises(ConfigError, match=field):
        cls(**bad)


def test_lease_ttl_is_the_chunk_gcs_own():
    assert GcOptions(lease_ttl="2h").lease_ttl == 7200.0
    with pytest.raises(ConfigError, match="lease_ttl"):
        GcOptions(lease_ttl="1m")
    with pytest.raises(TypeError):
        DataGcOptions(lease_ttl="1h")  # type: ignore[call-arg]
