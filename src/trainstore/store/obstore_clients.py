"""obstore clients for s3://, gs://, az:// and memory:// URLs, built from our options.

Validates what it can before any network call: a missing credential fails here (object_store
would otherwise probe the instance-metadata endpoint and hang on a machine without one), a
plain-http endpoint must be allowed explicitly, and a URL must name its bucket.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta

from obstore.store import AzureStore, GCSStore, MemoryStore, S3Store

from ..errors import ConfigError, CredentialsError
from .base import validate_key
from .options import RetryOptions, S3Options


def _td(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def _client_and_retry(retry: RetryOptions, allow_http: bool) -> tuple[dict, dict]:
    client = {
        "timeout": _td(retry.timeout_s),
        "connect_timeout": _td(retry.connect_timeout_s),
        "allow_http": allow_http,
    }
    retry_config = {
        "max_retries": retry.max_retries,
        "retry_timeout": _td(retry.retry_timeout_s),
        "backoff": {
            "init_backoff": _td(retry.init_backoff_s),
            "max_backoff": _td(retry.max_backoff_s),
            "base": 2,
        },
    }
    return client, retry_config


_memory_stores: dict[str, MemoryStore] = {}
_memory_lock = threading.Lock()


def _split_bucket(url: str, scheme: str) -> tuple[str, str]:
    rest = url[len(scheme) + 3 :]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigError(f"URL {url!r} names no bucket (expected {scheme}://BUCKET/PREFIX)")
    prefix = prefix.strip("/")
    if prefix:
        validate_key(prefix)
    return bucket, prefix


#: Environment variables of credential sources object_store resolves itself without
#: probing the instance-metadata endpoint (web identity / IRSA, ECS container credentials).
_FEDERATED_ENV = (
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


def build_s3(url: str, s3: S3Options, retry: RetryOptions) -> S3Store:
    """An obstore S3Store for ``url``, failing early (no network) on missing credentials."""
    bucket, prefix = _split_bucket(url, "s3")
    endpoint = s3.endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    key_id = s3.access_key_id or os.environ.get("AWS_ACCESS_KEY_ID")
    secret = s3.secret_access_key or os.environ.get("AWS_SECRET_ACCESS_KEY")
    token = s3.session_token or os.environ.get("AWS_SESSION_TOKEN")
    region = s3.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    federated = any(os.environ.get(v) for v in _FEDERATED_ENV)
    if not s3.skip_signature and not (key_id and secret) and not federated:
        # Without this check object_store would fall back to the instance-metadata endpoint
        # and hang on a machine that has none.
        raise CredentialsError(
            f"no credentials for {url}: pass access_key_id/secret_access_key or set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or skip_signature=True for a public bucket)"
        )
    allow_http = s3.allow_http if s3.allow_http is not None else bool(endpoint and endpoint.startswith("http://"))
    if endpoint and endpoint.startswith("http://") and not allow_http:
        raise ConfigError(f"endpoint {endpoint} is plain http; pass allow_http=True to allow it")
    config: dict = {"region": region}
    if endpoint:
        config["endpoint"] = endpoint
        config["virtual_hosted_style_request"] = False
    if s3.skip_signature:
        config["skip_signature"] = True
    elif key_id and secret:
        config["access_key_id"] = key_id
        config["secret_access_key"] = secret
        if token:
            config["session_token"] = token
    client, retry_config = _client_and_retry(retry, allow_http)
    try:
        return S3Store(
            bucket, prefix=prefix or None, config=config, client_options=client, retry_config=retry_config
        )
    except Exception as exc:  # obstore raises its own config errors
        raise ConfigError(f"cannot open {url}: {exc}") from None


def build_other(url: str, retry: RetryOptions, options: dict) -> object:
    """memory://NAME (shared per process by name), gs://BUCKET/PREFIX, az://CONTAINER/PREFIX."""
    if url.startswith("memory://"):
        name = url[len("memory://") :].strip("/") or "default"
        with _memory_lock:
            return _memory_stores.setdefault(name, MemoryStore())
    client, retry_config = _client_and_retry(retry, bool(options.pop("allow_http", False)))
    if url.startswith("gs://"):
        bucket, prefix = _split_bucket(url, "gs")
        cls = GCSStore
    elif url.startswith("az://"):
        bucket, prefix = _split_bucket(url, "az")
        cls = AzureStore
    else:
        raise ConfigError(f"unsupported URL scheme in {url!r}")
    try:
        return cls(bucket, prefix=prefix or None, config=options or None, client_options=client,
                   retry_config=retry_config)
    except Exception as exc:
        raise ConfigError(f"cannot open {url}: {exc}") from None


__all__ = ["build_other", "build_s3"]
