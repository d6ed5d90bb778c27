"""Child process for the ingest crash tests: writes numbered records until it is SIGKILLed.

Prints ``ACK first last`` (flushed) after each ``write`` returns, i.e. once the records are
acknowledged; the parent kills it at a random moment and checks what survived.
"""

import json
import os
import random
import sys

from trainstore.data.ingest import IngestConfig, Ingestor

store, wal_dir, durability, start, seed = sys.argv[1:6]
rng = random.Random(int(seed))
# "wal-direct": the log, but writes of >= 4 KiB go straight to shards (IngestConfig.direct_bytes)
direct = 4096 if durability == "wal-direct" else None
config = IngestConfig(wal_dir=wal_dir, durability=durability.removesuffix("-direct"), shard_bytes=16 << 10,
                      max_buffered_bytes=64 << 10, upload_workers=2, direct_bytes=direct)
# store options (JSON) for an object store, e.g. the fault proxy's endpoint and fast retries
options = json.loads(os.environ.get("TRAINSTORE_INGEST_CHILD_STORE_OPTIONS", "{}"))
ing = Ingestor(store, "crash", config=config, **options)
print("READY", ing.recovered_rows, flush=True)
next_id = int(start)
while True:
    n = rng.randint(1, 200)
    records = [{"id": i, "payload": "p" * rng.randint(0, 64)} for i in range(next_id, next_id + n)]
    ing.write(records)
    print("ACK", next_id, next_id + n - 1, flush=True)
    next_id += n
    if rng.random() < 0.1:
        v = ing.commit()
        print("COMMIT", v.version, flush=True)
