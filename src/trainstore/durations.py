"""Durations in configuration: seconds, or strings like ``"90s"``, ``"15min"``, ``"12h"``,
``"7d"``, ``"2w"`` - one parser for every option that takes a time (GC, retention, tiering,
checkpoint objectives, the verifier)."""

from __future__ import annotations

import math
import re
from typing import overload

from .errors import ConfigError

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|min|m|h|d|w|)\s*$")


@overload
def parse_duration(value: None, what: str = ...) -> None: ...
@overload
def parse_duration(value: float | str, what: str = ...) -> float: ...
def parse_duration(value: float | str | None, what: str = "duration") -> float | None:
    """Seconds (finite, >= 0) from a number or a duration string; None stays None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{what} must be seconds or a string like '7d', got {value!r}")
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m is None:
            raise ConfigError(f"{what} must be seconds or a string like '90s', '15min', '12h', '7d', '2w', "
                              f"got {value!r}")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    else:
        seconds = float(value)
    if not 0 <= seconds < math.inf:
        raise ConfigError(f"{what} must be a finite non-negative duration, got {value!r}")
    return seconds


def positive_duration(value: float | str, what: str = "duration") -> float:
    """``parse_duration`` that also refuses zero."""
    seconds = parse_duration(value, what)
    if not seconds > 0:
        raise ConfigError(f"{what} must be a positive finite duration, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """``90061 -> "1.04d"``: the largest unit that is at least 1."""
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= n:
            return f"{seconds / n:.3g}{unit}"
    return f"{seconds:.3g}s"


__all__ = ["parse_duration", "positive_duration", "format_duration"]
