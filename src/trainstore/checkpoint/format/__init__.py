"""What a checkpoint is in a store: the manifest and its entries, keys and lineage, packs,
XOR deltas, restore-ready copies and the flattened state (used by both the save and the
restore path)."""
