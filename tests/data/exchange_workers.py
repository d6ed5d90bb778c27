"""Rank functions of the exchange-mode tests (run by harness.dist.run_ranks).

Each rank is a "node": its own node-cache directory, its own counting view of the S3 store.
"""

from __future__ import annotations

from harness.counting import CountingStore

from trainstore import open_store
from trainstore.data import Dataset, Loader


def open_loader(args: dict, rank: int, world: int, exchange: bool) -> tuple[Loader, CountingStore]:
    store = CountingStore(open_store(args["url"], **args["options"]))
    ds = Dataset(store, args["ref"], cache_dir=f"{args['root']}/node{rank}-{int(exchange)}")
    loader = Loader(ds, batch_size=args["batch"], seed=args["seed"], rank=rank, world_size=world,
                    exchange=exchange, prefetch=2, workers=2)
    return loader, store


def epochs(rank: int, world: int, args: dict) -> dict:
    """Run ``epochs`` epochs (exchange on or off); per epoch: the batches (idx and a checksum
    of x per row), and the object-store bytes read."""
    loader, store = open_loader(args, rank, world, args["exchange"])
    out: dict = {"epochs": [], "bytes": []}
    for _ in range(args["epochs"]):
        before = store.bytes_read
        batches = []
        for batch in loader:
            batches.append({"idx": batch["idx"].tolist(), "x0": batch["x"][:, 0, 0].tolist(),
                            "xsum": batch["x"].sum(axis=(1, 2)).tolist(), "label": batch["label"].tolist()})
        out["epochs"].append(batches)
        out["bytes"].append(store.bytes_read - before)
    # resume mid-epoch: stop after `stop` batches, a new loader continues from the state
    first = []
    for i, batch in enumerate(loader):
        first.append(batch["idx"].tolist())
        if i + 1 == args["stop"]:
            break
    state = loader.state_dict()
    loader.close()
    resumed, _ = open_loader(args, rank, world, args["exchange"])
    resumed.load_state_dict(state)
    out["resume_first"] = first
    out["resume_rest"] = [b["idx"].tolist() for b in resumed]
    out["resume_epoch"] = state["epoch"]
    resumed.close()
    return out
