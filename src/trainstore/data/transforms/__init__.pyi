"""Public names of the transform stage (lazy_loader reads this stub at run time)."""

from .cleaning import DROP as DROP, CleanConfig as CleanConfig, clean as clean
from .engines import ENGINES as ENGINES
from .features import byte_tokens as byte_tokens
from .runner import TransformConfig as TransformConfig, transform as transform
