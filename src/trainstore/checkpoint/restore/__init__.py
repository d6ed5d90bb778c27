"""The restore path: reading a checkpoint's chunks straight into destination memory (deltas,
packs and restore-ready copies included), partial restores, and verification. Which
checkpoint a restore loads, skipping bad ones, is ``checkpoint.recovery``."""
