"""What every derived dataset version records about how it was made.

``config_hash`` is the BLAKE3 of the canonical JSON of an operation's configuration (sorted
keys), so two runs with the same inputs and settings agree on it; ``code_version`` is
``git describe`` of the trainstore checkout when there is one, else the installed version.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from typing import Any

import blake3


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_hash(config: Any) -> str:
    """BLAKE3 hex of the canonical JSON of ``config``."""
    return blake3.blake3(canonical_json(config).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """``git describe --always --dirty`` of this package's checkout, else ``trainstore <version>``."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--tags"],
            cwd=here, capture_output=True, text=True, timeout=5, check=True,
        ).stdout.strip()
        if out:
            return f"git:{out}"
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        from importlib.metadata import version

        return f"trainstore {version('trainstore')}"
    except Exception:  # noqa: BLE001 - metadata missing in odd installs
        return "unknown"
