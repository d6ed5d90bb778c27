"""Re-export of ``data.transforms.features``: keeps the documented worker path
``trainstore.data.features:byte_tokens`` (CLI ``trainstore data transform ... --fn``) working."""

from .transforms.features import byte_tokens

__all__ = ["byte_tokens"]
