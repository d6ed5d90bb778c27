"""A GC sweep that deletes slowly, so the test can SIGKILL it mid-sweep (marker left "running")."""

import sys
import time

from trainstore import open_store
from trainstore.lifecycle.gc import GcOptions, collect_garbage
from trainstore.store.local import LocalStore

_delete = LocalStore.delete


def slow_delete(self, key):
    time.sleep(0.05)
    return _delete(self, key)


LocalStore.delete = slow_delete
store = open_store(sys.argv[1])
collect_garbage(store, GcOptions(grace=0, workers=1, batch=1),
                progress=lambda what, done, total: print(what, done, total, flush=True))
print("FINISHED", flush=True)
