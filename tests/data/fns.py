"""Transform functions used by the tests (importable by worker processes)."""

import pyarrow as pa
import pyarrow.compute as pc


def double_id(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pc.multiply(batch.column("id"), 2)], names=["id2"])


def boom_after_100(batch: pa.RecordBatch) -> pa.RecordBatch:
    if pc.max(batch.column("id")).as_py() >= 100:
        raise ValueError("bad id")
    return double_id(batch)
