"""How to reach an object store: retry and S3 options (frozen, validated config).

Kept apart from the clients that use them so ``retrying`` (our own retries) and
``objectstore`` (the ``Store`` over obstore) both import the options and not each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError


@dataclass(frozen=True)
class RetryOptions:
    """Bounded retries with exponential backoff and jitter (applied by obstore)."""

    max_retries: int = 5
    retry_timeout_s: float = 60.0
    init_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    timeout_s: float = 60.0
    connect_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_retries, int) or isinstance(self.max_retries, bool) or not 0 <= self.max_retries <= 100:
            raise ConfigError(f"max_retries must be an int in [0, 100], got {self.max_retries!r}")
        for name in ("retry_timeout_s", "init_backoff_s", "max_backoff_s", "timeout_s", "connect_timeout_s"):
            value = getattr(self, name)
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not 0 <= value <= 86_400 or value != value):
                raise ConfigError(f"{name} must be a number of seconds in [0, 86400], got {value!r}")


@dataclass(frozen=True)
class S3Options:
    """How to reach an S3-compatible endpoint. Unset fields fall back to AWS_* env vars."""

    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    allow_http: bool | None = None  # default: allowed when the endpoint is http://
    skip_signature: bool = False  # anonymous access to public buckets

    def __post_init__(self) -> None:
        for name in ("endpoint", "region", "access_key_id", "secret_access_key", "session_token"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"S3 option {name} must be a string, got {type(value).__name__}")
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"S3 endpoint must start with http:// or https://, got {self.endpoint!r}")
        for name in ("allow_http", "skip_signature"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"S3 option {name} must be True or False, got {value!r}")



__all__ = ["RetryOptions", "S3Options"]
