"""Retention rules: small composable *keep* rules, each saying why it keeps a checkpoint.

A rule looks at every checkpoint of a job at once (a ``RetentionView``: manifests oldest
first, the clock, the registry's protected steps) and returns the steps it keeps, each with
its reason strings (``"among the last 3"``, ``"best #1 by val_loss=0.31 (min)"``). For a
checkpoint it does not keep, ``miss`` says why not, so a deletion is always explained.

Rules compose like orbax's preservation policies::

    AnyOf(LatestN(3), EveryNSteps(1000), BestN("val_loss", 2), Registered())
    AllOf(FullWithin("30d"), EveryNSteps(100))      # milestones, but only recent full ones

``AnyOf`` keeps what any member keeps; ``AllOf`` what every member keeps. The planner in
``retention.py`` adds two safety rules no policy can switch off: the newest full checkpoint
(base of the next incrementals) and the base of every kept incremental.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from ..checkpoint.format import manifest as mf
from ..durations import format_duration, parse_duration
from ..errors import ConfigError


def _positive_int(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{what} must be a positive int, got {value!r}")
    return value


def _duration(value: float | int | str, what: str) -> float:
    seconds = parse_duration(value, what)
    if seconds is None:
        raise ConfigError(f"{what} needs a duration such as '7d', got None")
    return seconds


@dataclass(frozen=True)
class RetentionView:
    """What every rule decides on: a job's readable manifests (oldest first), the clock, and
    (read only if a rule asks) the registry's protected steps ``{step: reason}``."""

    manifests: tuple[mf.Manifest, ...]
    now: float
    registry_lookup: Callable[[], Mapping[int, str]] = field(default=lambda: {}, compare=False)

    @cached_property
    def protected(self) -> Mapping[int, str]:
        return self.registry_lookup()

    def age(self, m: mf.Manifest) -> float:
        return max(0.0, self.now - m.created)


class Rule(ABC):
    """One keep rule. ``keep`` returns ``{step: reason}`` for the checkpoints it keeps;
    ``miss`` says why a checkpoint it does not keep fell through; ``describe`` names it."""

    @abstractmethod
    def keep(self, view: RetentionView) -> dict[int, list[str]]: ...

    @abstractmethod
    def miss(self, m: mf.Manifest, view: RetentionView) -> str: ...

    @abstractmethod
    def describe(self) -> str: ...


@dataclass(frozen=True)
class LatestN(Rule):
    """The ``n`` newest steps."""

    n: int

    def __post_init__(self) -> None:
        _positive_int(self.n, "LatestN.n")

    def keep(self, view: RetentionView) -> dict[int, list[str]]:
        return {m.step: [f"among the last {self.n}"] for m in view.manifests[-self.n:]}

    def miss(self, m: mf.Manifest, view: RetentionView) -> str:
        return f"not among the last {self.n}"

    def describe(self) -> str:
        return f"last {self.n}"


@dataclass(frozen=True)
class Within(Rule):
    """Every checkpoint created less than ``duration`` ago (seconds or ``"7d"``)."""

    duration: float | str

    def __post_init__(self) -> None:
        object.__setattr__(self, "duration", _duration(self.duration, "Within.duration"))

    def keep(self, view: RetentionView) -> dict[int, list[str]]:
        limit = float(self.duration)
        return {m.step: [f"age {format_duration(view.age(m))} within {format_duration(limit)}"]
                for m in view.manifests if view.age(m) <= limit}

    def miss(self, m: mf.Manifest, view: RetentionView) -> str:
        return f"older than {format_duration(float(self.duration))}"

    def describe(self) -> str:
        return f"all within {format_duration(float(self.duration))}"


@dataclass(frozen=True)
class FullWithin(Rule):
    """Full checkpoints created less than ``duration`` ago."""

    duration: float | str

    def __post_init__(self) -> None:
        object.__setattr__(self, "duration", _duration(self.duration, "FullWithin.duration"))

    def keep(self, view: RetentionView) -> dict[int, list[str]]:
        limit = float(self.duration)
        return {m.step: [f"full, age {format_duration(view.age(m))} within {format_duration(limit)}"]
                for m in view.manifests if m.kind == "full" and view.age(m) <= limit}

    def miss(self, m: mf.Manifest, view: RetentionView) -> str:
        if m.kind != "full":
            return "not full"
        return f"full but older than {format_duration(float(self.duration))}"

    def describe(self) -> str:
        return f"full within {format_duration(float(self.duration))}"


@dataclass(frozen=True)
class EveryNSteps(Rule):
    """Steps that are multiples of ``n`` (milestones)."""

    n: int

    def __post_init__(self) -> None:
        _positive_int(self.n, "EveryNSteps.n")

    def keep(self, view: RetentionView) -> dict[int, list[str]]:
        return {m.step: [f"step is a multiple of {self.n}"] for m in view.manifests if m.step % self.n == 0}

    def miss(self, m: mf.Manifest, view: RetentionView) -> str:
        return f"not a multiple of {self.n}"

    def describe(self) -> str:
        return f"every {self.n}th step"


@dataclass(frozen=True)
class BestN(Rule):
    """The ``n`` checkpoints with the best recorded ``metric`` (``mode`` "min" or "max");
    ties go to the newer step. Checkpoints without the metric are never "best"."""

    metric: str
    n: int = 1
    mode: str = "min"

    def __post_init__(self) -> None:
        if not isinstance(self.metric, str) or not self.metric:
            raise ConfigError(f"BestN.metric must be a metric name, got {self.metric!r}")
        _positive_int(self.n, "BestN.n")
        if self.mode not in ("min", "max"):
            raise ConfigError(f"BestN.mode must be 'min' or 'max', got {self.mode!r}")

    @classmethod
    def parse(cls, text: str) -> BestN:
        """``"val_loss:3:min"`` (n and mode optional: ``"acc::max"``, ``"val_loss"``)."""
        parts = text.split(":")
        if not 1 <= len(parts) <= 3 or not parts[0]:
            raise ConfigError(f"keep-best must look like METRIC[:N[:min|max]], got {text!r}")
        try:
            n = int(parts[1]) if len(parts) > 1 and parts[1] else 1
        except ValueError:
            raise ConfigError(f"keep-best count must be an int, got {parts[1]!r} in {text!r}") from None
        return cls(parts[0], n, parts[2] if len(parts) > 2 and parts[2] else "min")

    def keep(self, view: RetentionView) -> dict[int, list[str]]:
        scored = [(v, m.step) for m in view.manifests
                  if isinstance(v := m.metrics.get(self.metric), (int, float)) and not isinstance(v, bool)]
        scored.sort(key=lambda p: (p[0] if self.mode == "min" else -p[0], -p[1]))
        return {s: [f"best #{rank} by {self.metric}={v:.4g} ({self.mode})"]
                for rank, (v, s) in enumerate(scored[:self.n], 1)}

    def miss(self, m: mf.Manifest, view: RetentionView) -> str:
        return f"not best {self.n} by {self.metric}"

    def describe(self) -> str:
        return f"best {self.n} by {self.metric} ({self.mode})"


#: The name the first version of this API used; the same rule.
KeepBest = BestN


@dataclass(frozen=True)
class Registered(Rule):
    """Every checkpoint a registered model version points at (aliased ones too), forever."""

    def keep(self, view: RetentionView) -> dict[int, list[str]]:
        present = {m.step for m in view.manifests}
        return {s: [why] for s, why in view.protected.items() if s in present}

    def miss(self, m: mf.Manifest, view: RetentionView) -> str:
        return "not registered"

    def describe(self) -> str:
        return "registered forever"


def _flatten(kind: type, rules: tuple[Rule, ...]) -> tuple[Rule, ...]:
    out: list[Rule] = []
    for r in rules:
        if not isinstance(r, Rule):
            raise ConfigError(f"{kind.__name__} takes retention rules, got {r!r}")
        out.extend(r.rules if isinstance(r, kind) else (r,))  # type: ignore[attr-defined]
    return tuple(out)


@dataclass(frozen=True, init=False)
class AnyOf(Rule):
    """Keeps what any member keeps (reasons of every member that keeps it)."""

    rules: tuple[Rule, ...]

    def __init__(self, *rules: Rule) -> None:
        object.__setattr__(self, "rules", _flatten(AnyOf, rules))

    def keep(self, view: RetentionView) -> dict[int, list[str]]:
        reasons: dict[int, list[str]] = {}
        for rule in self.rules:
            for step, why in rule.keep(view).items():
                reasons.setdefault(step, []).extend(why)
        return {s: list(dict.fromkeys(w)) for s, w in reasons.items()}

    def miss(self, m: mf.Manifest, view: RetentionView) -> str:
        return "; ".join(dict.fromkeys(r.miss(m, view) for r in self.rules)) or "no keep rule"

    def describe(self) -> str:
        return ", ".join(r.describe() for r in self.rules) or "nothing"


@dataclass(frozen=True, init=False)
class AllOf(Rule):
    """Keeps what every member keeps (an empty ``AllOf`` keeps nothing)."""

    rules: tuple[Rule, ...]

    def __init__(self, *rules: Rule) -> None:
        object.__setattr__(self, "rules", _flatten(AllOf, rules))

    def keep(self, view: RetentionView) -> dict[int, list[str]]:
        if not self.rules:
            return {}
        kept = [rule.keep(view) for rule in self.rules]
        common = set(kept[0]).intersection(*kept[1:])
        return {s: [" and ".join("; ".join(k[s]) for k in kept)] for s in common}

    def miss(self, m: mf.Manifest, view: RetentionView) -> str:
        misses = [r.miss(m, view) for r in self.rules if m.step not in r.keep(view)]
        return "; ".join(misses) or "no keep rule"

    def describe(self) -> str:
        return "(" + " and ".join(r.describe() for r in self.rules) + ")" if self.rules else "nothing"


def preset() -> AnyOf:
    """The rule set of the design documents: every checkpoint of the last week, full ones of
    the last month, registered ones forever."""
    return AnyOf(Within("7d"), FullWithin("30d"), Registered())


__all__ = ["Rule", "RetentionView", "LatestN", "Within", "FullWithin", "EveryNSteps", "BestN", "KeepBest",
           "Registered", "AnyOf", "AllOf", "preset", "parse_duration", "format_duration"]
