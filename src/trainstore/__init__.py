"""trainstore: the storage layer of an AI training pipeline.

Imports are lazy: ``import trainstore`` stays cheap (no torch, no pyarrow) until a part is
used.
"""

from __future__ import annotations

import lazy_loader

from . import errors as errors
from .errors import TrainstoreError as TrainstoreError
from .store import open_store as open_store

__version__ = "0.1.0"  # the one source of the version (pyproject reads it)

# Every other public name is listed in __init__.pyi and imported on first use.
__getattr__, __dir__, _lazy_names = lazy_loader.attach_stub(__name__, __file__)
__all__ = [*_lazy_names, "__version__"]
