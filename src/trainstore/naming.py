"""Names users choose (jobs, datasets, model names, aliases): one pattern, one check.

Names become segments of store keys (``jobs/<job>/...``, ``datasets/<name>/...``), so they
are restricted to a safe, portable alphabet: a letter or digit, then up to 127 letters,
digits, ``.``, ``_`` or ``-``.
"""

from __future__ import annotations

import re

from .errors import ConfigError

#: The pattern of a name, without anchors (for embedding in larger patterns).
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_NAME = re.compile(rf"^{NAME_PATTERN}$")


def check_name(value: object, what: str) -> str:
    """Return ``value`` if it is a valid name, else raise ``ConfigError`` naming ``what``."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigError(f"{what} must match ^{NAME_PATTERN}$, got {value!r}")
    return value


__all__ = ["NAME_PATTERN", "check_name"]
