"""Loaders streaming from S3, side by side, DLIO style (issue 16 items 2-3).

The remote is moto's S3 server (``trainstore.testing.s3server``, 127.0.0.1); every system
reads it through its own byte-counting TCP proxy (one process per system), so "bytes from S3" is
what crossed the wire for that system alone, headers and index files included (a peer's loader
kept open between points and still downloading does not count into another's epoch). The same
samples, each in its own system's format and shard size (dataset / 32, at least one sample):

* ``trainstore``: an arrow-ipc version on ``s3://``, ``Loader`` (block shuffle, window 2
  shards) filling the node cache (``cache_limit``);
* ``streaming``: mosaicml-streaming ``StreamingDataset(remote="s3://...", local=...,
  cache_limit=...)`` (MDS shards, endpoint from ``S3_ENDPOINT_URL``) + torch ``DataLoader``;
* ``litdata``: ``StreamingDataset(input_dir="s3://...", max_cache_size=...,
  storage_options={"endpoint_url": ...})`` + ``StreamingDataLoader``.

Accelerator time is a fixed sleep per batch; AU = compute / wall of a whole epoch (first
batch included: a cold start counts). Regimes: ``cold`` (a new reader with an empty cache
each try), ``warm`` (everything cached), ``cache25`` / ``cache50`` (cache limit 25% / 50% of
the dataset, steady-state epochs). Per regime and system: the no-compute epoch, then a
geometric ladder of computes (x1.5, tried interleaved across systems, ``--reps`` each, median
AU) up to the first with AU >= 90% and one bisection step (a system skips the points below 0.8x
its own no-compute ms/batch, where AU ~ compute / that stays under 90%; the bisection step below
a first hit still tries the skipped range); then every system at the goal point, 0.67x the best peer's minimal compute. Bytes per epoch: median over the tries.

Run: ``.venv/bin/python benchmarks/loader_s3.py --dataset-mb 256`` (several GB:
``--dataset-mb 4096 --workloads small``). Peers: ``pip install --no-deps -r benchmarks/peers.txt``
(their runtime imports: ``pip install -r benchmarks/requirements.txt``; ``make bench`` does both).
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loader import import_streaming  # noqa: E402  (benchmarks/loader.py: streaming core without vision)

from trainstore import open_store  # noqa: E402
from trainstore.data import Dataset, Loader  # noqa: E402
from trainstore.data.serve import write_arrow_dataset  # noqa: E402
from trainstore.testing.s3server import ACCESS_KEY, SECRET_KEY, start_s3_server  # noqa: E402

WORKERS = 2
SHARDS = 32
AU_GOAL = 0.9
GOAL_RATIO = 0.67
SKIP_BELOW = 0.8  # ladder points below 0.8x a system's own no-compute ms/batch are skipped (a heuristic)
REGIMES = ("cold", "warm", "cache25", "cache50")


@dataclass(frozen=True)
class Workload:
    name: str
    sample_shape: tuple[int, ...]
    batch_size: int

    @property
    def sample_bytes(self) -> int:
        return int(np.prod(self.sample_shape)) * 4


WORKLOADS = {
    "small": Workload("small", (3, 98, 98), 64),  # ~115 KB samples (resnet50-like)
    "large": Workload("large", (4, 128, 128, 120), 1),  # ~31 MB samples (unet3d-like)
}


# -- byte-counting TCP proxy (own process: its pumping must not share trainstore's GIL) -------
def _pump(src: socket.socket, dst: socket.socket, counter) -> None:
    try:
        while data := src.recv(1 << 20):
            dst.sendall(data)
            if counter is not None:
                with counter.get_lock():
                    counter.value += len(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _serve_proxy(upstream_port: int, port_out, counter) -> None:
    srv = socket.create_server(("127.0.0.1", 0), backlog=256)
    port_out.put(srv.getsockname()[1])
    while True:
        client, _ = srv.accept()
        up = socket.create_connection(("127.0.0.1", upstream_port))
        for a, b, c in ((client, up, None), (up, client, counter)):
            threading.Thread(target=_pump, args=(a, b, c), daemon=True).start()


class CountingProxy:
    """A TCP proxy in front of the S3 endpoint; ``down`` = bytes sent to the clients."""

    def __init__(self, upstream: str) -> None:
        ctx = mp.get_context("spawn")
        self._counter = ctx.Value("q", 0)
        q = ctx.Queue()
        self._proc = ctx.Process(target=_serve_proxy, args=(int(upstream.rsplit(":", 1)[1]), q, self._counter),
                                 daemon=True)
        self._proc.start()
        self.endpoint = f"http://127.0.0.1:{q.get(timeout=30)}"

    @property
    def down(self) -> int:
        return self._counter.value

    def stop(self) -> None:
        self._proc.kill()
        self._proc.join(10)


# -- the systems ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Remote:
    bucket: str
    direct: str  # moto endpoint (writes)
    proxied: str  # through the counting proxy (reads)

    def store_options(self, endpoint: str) -> dict:
        return {"endpoint": endpoint, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY,
                "region": "us-east-1", "allow_http": True}

    def upload_dir(self, local: str, prefix: str) -> None:
        import boto3

        client = boto3.client("s3", endpoint_url=self.direct, aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY, region_name="us-east-1")
        for root, _dirs, files in os.walk(local):
            for f in files:
                path = os.path.join(root, f)
                client.upload_file(path, self.bucket, f"{prefix}/{os.path.relpath(path, local)}")


class Trainstore:
    name = "trainstore"
    counted = True

    def write(self, remote: Remote, samples: np.ndarray, shard_rows: int, scratch: str) -> None:
        self.url = f"s3://{remote.bucket}/trainstore"
        self.remote = remote
        write_arrow_dataset(open_store(self.url, **remote.store_options(remote.direct)), "bench",
                            {"x": samples}, shard_rows)

    def open(self, w: Workload, cache_dir: str, limit: int | None) -> None:
        ds = Dataset(self.url, "bench@1", cache_dir=cache_dir, cache_limit=limit,
                     **self.remote.store_options(self.remote.proxied))
        self.loader = Loader(ds, w.batch_size, seed=0, shuffle_mode="block", block_shards=2,
                             workers=WORKERS, prefetch=4)

    def epoch(self):
        for b in self.loader:
            yield len(b["x"])

    def close(self) -> None:
        self.loader.close()
        self.loader = None


class Streaming:
    name = "streaming"
    counted = True

    def write(self, remote: Remote, samples: np.ndarray, shard_rows: int, scratch: str) -> None:
        MDSWriter, _ = import_streaming()
        out = os.path.join(scratch, "mds")
        cols = {"x": "ndarray:float32:" + ",".join(map(str, samples.shape[1:]))}
        with MDSWriter(out=out, columns=cols, size_limit=shard_rows * samples[0].nbytes + (1 << 16)) as wr:
            for x in samples:
                wr.write({"x": x})
        remote.upload_dir(out, "streaming")
        shutil.rmtree(out)
        self.remote = f"s3://{remote.bucket}/streaming"
        os.environ["S3_ENDPOINT_URL"] = remote.proxied  # streaming's S3 endpoint (workers inherit)

    def open(self, w: Workload, cache_dir: str, limit: int | None) -> None:
        from torch.utils.data import DataLoader

        _, StreamingDataset = import_streaming()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        self.ds = StreamingDataset(remote=self.remote, local=cache_dir, cache_limit=limit, shuffle=True,
                                   shuffle_seed=0, batch_size=w.batch_size)
        self.loader = DataLoader(self.ds, batch_size=w.batch_size, num_workers=WORKERS, prefetch_factor=4,
                                 persistent_workers=True)

    def epoch(self):
        for b in self.loader:
            yield len(b["x"])

    def close(self) -> None:
        from streaming.base.util import clean_stale_shared_memory

        self.loader = self.ds = None
        gc.collect()
        clean_stale_shared_memory()


def _litdata_allow_http(_worker_id: int = 0) -> None:
    """litdata fetches chunks with obstore and passes its own client options, which drop
    allow_http (obstore#159): add it (in every worker), or http endpoints (moto) fail with
    BadScheme."""
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True


class Litdata:
    name = "litdata"
    #: ``--litdata-direct``: read moto directly, bytes not counted (n/c). Through the counting
    #: proxy it passes (ranged GETs of 31 MB chunks included, with spawned workers); at a 25%
    #: cache limit it sometimes times out waiting for a chunk (120 s), direct or proxied alike
    direct = False

    @property
    def counted(self) -> bool:
        return not self.direct

    def write(self, remote: Remote, samples: np.ndarray, shard_rows: int, scratch: str) -> None:
        from litdata.streaming.writer import BinaryWriter

        out = os.path.join(scratch, "litdata")
        writer = BinaryWriter(cache_dir=out, chunk_bytes=shard_rows * samples[0].nbytes + (1 << 16))
        for i, x in enumerate(samples):
            writer.add_item(i, {"x": x})
        writer.done()
        writer.merge()
        remote.upload_dir(out, "litdata")
        shutil.rmtree(out)
        self.url = f"s3://{remote.bucket}/litdata"
        self.options = {"endpoint_url": remote.direct if self.direct else remote.proxied, "aws_access_key_id": ACCESS_KEY,
                        "aws_secret_access_key": SECRET_KEY, "region_name": "us-east-1"}

    def open(self, w: Workload, cache_dir: str, limit: int | None) -> None:
        from litdata import StreamingDataLoader, StreamingDataset

        _litdata_allow_http()
        ds = StreamingDataset(self.url, cache_dir=cache_dir, shuffle=True, seed=0, storage_options=self.options,
                              **({"max_cache_size": limit} if limit else {}))
        # spawned workers: trainstore in this process has started obstore's runtime, which a
        # forked litdata worker inherits and hangs on (litdata's "obstore-after-fork")
        self.loader = StreamingDataLoader(ds, batch_size=w.batch_size, num_workers=WORKERS, prefetch_factor=4,
                                          persistent_workers=True, multiprocessing_context="spawn",
                                          worker_init_fn=_litdata_allow_http)

    def epoch(self):
        for b in self.loader:
            yield len(b["x"])

    def close(self) -> None:
        self.loader = None
        gc.collect()


SYSTEMS = {"trainstore": Trainstore, "streaming": Streaming, "litdata": Litdata}


# -- measurement ---------------------------------------------------------------------------------
class Bench:
    def __init__(self, proxies: dict[str, CountingProxy], w: Workload, total: int, scratch: str, reps: int,
                 max_try_s: float, log) -> None:
        self.proxies, self.w, self.total, self.scratch = proxies, w, total, scratch
        self.reps, self.max_try_s, self.log = reps, max_try_s, log
        self._n = 0
        self.errors: dict[tuple[str, str], str] = {}

    def _cache_dir(self, system) -> str:
        self._n += 1
        return os.path.join(self.scratch, "cache", f"{system.name}-{self._n}")

    def limit(self, regime: str) -> int | None:
        return {"cache25": self.total // 4, "cache50": self.total // 2}.get(regime)

    def open(self, system, regime: str) -> None:
        system.open(self.w, self._cache_dir(system), self.limit(regime))

    def close(self, system) -> None:
        system.close()
        shutil.rmtree(os.path.join(self.scratch, "cache"), ignore_errors=True)

    def epoch(self, system, regime: str, compute_s: float) -> dict:
        """One epoch at ``compute_s`` per batch (cold: on a new reader with an empty cache)."""
        if regime == "cold":
            self.open(system, regime)
        proxy = self.proxies[system.name]
        b0 = proxy.down
        t0 = time.perf_counter()
        n = samples = 0
        for rows in system.epoch():
            n += 1
            samples += rows
            if compute_s:
                time.sleep(compute_s)
        wall = time.perf_counter() - t0
        got = proxy.down - b0
        if regime == "cold":
            self.close(system)
        return {"au": n * compute_s / wall, "wall_s": wall, "batches": n, "samples": samples,
                "per_batch_s": wall / max(n, 1), "bytes": got}

    def point(self, systems: dict, regime: str, compute_s: float) -> dict[str, dict]:
        """``reps`` interleaved epochs of each system at one compute; medians. A system that
        fails is dropped from ``systems`` (its error kept in ``self.errors``)."""
        runs: dict[str, list[dict]] = {n: [] for n in systems}
        for _ in range(self.reps):
            for name, s in list(systems.items()):
                try:
                    runs[name].append(self.epoch(s, regime, compute_s))
                except Exception as exc:  # noqa: BLE001 - a peer failing in a regime is a result
                    self.fail(systems, name, regime, exc)
                    runs.pop(name, None)
        out = {}
        for name, rs in runs.items():
            out[name] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            self.log(f"    {regime:<8} {name:<11} compute {compute_s * 1e3:8.1f} ms: AU {out[name]['au']:6.1%}"
                     f"  epoch {out[name]['wall_s']:6.2f} s  S3 {out[name]['bytes'] / self.total:5.2f}x dataset"
                     f"  ({out[name]['samples']:.0f} samples)")
        return out

    def fail(self, systems: dict, name: str, regime: str, exc: BaseException) -> None:
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[-1][:300] if str(exc) else ''}"
        self.errors[(regime, name)] = msg
        self.log(f"    {regime:<8} {name:<11} FAILED: {msg}")
        s = systems.pop(name)
        try:
            self.close(s)
        except Exception:  # noqa: BLE001, S110 - already failed
            pass

    def regime(self, all_systems: dict, regime: str) -> dict:
        systems = dict(all_systems)
        res: dict = {n: {"tries": [], "min_compute_ms": None} for n in systems}
        if regime != "cold":
            for n, s in list(systems.items()):
                try:
                    self.open(s, regime)
                    self.epoch(s, regime, 0.0)  # fill / steady state: not measured
                except Exception as exc:  # noqa: BLE001
                    self.fail(systems, n, regime, exc)
        base = self.point(systems, regime, 0.0)
        for n, r in base.items():
            res[n]["nocompute_ms_per_batch"] = r["per_batch_s"] * 1e3
            res[n]["tries"].append((0.0, r))
        if not base:
            return self._finish(res, systems, all_systems, regime)
        batches = max(r["batches"] for r in base.values())
        c = 0.75 * min(r["per_batch_s"] for r in base.values())
        searching = dict(systems)
        last_miss = {n: 0.0 for n in systems}
        own = {n: r["per_batch_s"] for n, r in base.items()}
        while searching:
            if c * batches > self.max_try_s:
                self.log(f"    {regime}: AU {AU_GOAL:.0%} not reached below {c * 1e3:.1f} ms by "
                         f"{', '.join(searching)}")
                break
            # AU ~ compute / (no-compute wall per batch), so a system whose own no-compute epoch
            # is slower than c / 0.8 is not expected to reach 90% at c and skips it. Not a bound: a
            # cache-limited epoch can run faster with compute than without (streaming: 90.0% at
            # 0.86x its no-compute ms/batch), so the bisection below a first hit is not skipped
            skipped = {n for n in searching if c < SKIP_BELOW * own[n]}
            for n in skipped:
                last_miss[n] = c
            if len(skipped) == len(searching):
                c *= 1.5
                continue
            trying = {n: s for n, s in searching.items() if n not in skipped}
            got = self.point(trying, regime, c)
            for n in set(searching) - skipped - set(trying):
                del searching[n]  # failed at this point
            for n in list(systems):
                if n not in searching and res[n]["min_compute_ms"] is None:
                    del systems[n]  # failed
            for n, r in got.items():
                res[n]["tries"].append((c * 1e3, r))
                if r["au"] >= AU_GOAL:
                    res[n]["min_compute_ms"] = c * 1e3
                else:
                    last_miss[n] = c
            hit = {n: searching[n] for n, r in got.items() if r["au"] >= AU_GOAL}
            for n in hit:
                del searching[n]
            mids = {n: s for n, s in hit.items() if last_miss[n] > 0}
            for n, s in mids.items():  # one bisection step between the last miss and the hit
                mid = (last_miss[n] + c) / 2
                one = {n: s}
                r = self.point(one, regime, mid).get(n)
                if r is None:
                    systems.pop(n, None)
                    continue
                res[n]["tries"].append((mid * 1e3, r))
                if r["au"] >= AU_GOAL:
                    res[n]["min_compute_ms"] = mid * 1e3
            c *= 1.5
        peers = [res[n]["min_compute_ms"] for n in systems if n != "trainstore" and res[n]["min_compute_ms"]]
        if "trainstore" in systems and peers:
            goal = GOAL_RATIO * min(peers) / 1e3
            at_goal = self.point(systems, regime, goal)
            for n, r in at_goal.items():
                res[n]["tries"].append((goal * 1e3, r))
                res[n]["au_at_goal"] = r["au"]
            res["goal_compute_ms"] = goal * 1e3
        return self._finish(res, systems, all_systems, regime)

    def _finish(self, res: dict, systems: dict, all_systems: dict, regime: str) -> dict:
        for n, v in res.items():
            if n == "goal_compute_ms":
                continue
            if (regime, n) in self.errors:
                v["error"] = self.errors[(regime, n)]
            measured = [r["bytes"] for _c_ms, r in v["tries"]]
            counted = measured and getattr(all_systems[n], "counted", True)
            v["s3_bytes_per_epoch"] = statistics.median(measured) if counted else None
            v["s3_bytes_per_epoch_x"] = v["s3_bytes_per_epoch"] / self.total if counted else None
        if regime != "cold":
            for s in systems.values():
                self.close(s)
        return res


def generate(w: Workload, dataset_bytes: int) -> np.ndarray:
    n = max(SHARDS // 2, dataset_bytes // w.sample_bytes)
    out = np.empty((n, *w.sample_shape), dtype=np.float32)
    for i in range(n):
        out[i] = np.random.default_rng(i).random(w.sample_shape, dtype=np.float32)
    return out


def report(results: list[dict], log) -> None:
    log("\n| dataset | regime | system | no-compute ms/batch | min compute ms/batch, AU>=90% | vs best peer "
        "| AU at 0.67x best peer | S3 bytes/epoch (x dataset) |")
    log("|---|---|---|---|---|---|---|---|")
    for res in results:
        for regime in REGIMES:
            r = res["regimes"].get(regime)
            if not r:
                continue
            peers = [r[n]["min_compute_ms"] for n in r if n not in ("trainstore", "goal_compute_ms")
                     and r[n]["min_compute_ms"]]
            best = min(peers) if peers else None
            for n, v in r.items():
                if n == "goal_compute_ms":
                    continue
                if "nocompute_ms_per_batch" not in v:
                    log(f"| {res['workload']} | {regime} | {n} | failed: {v.get('error', '?')} | | | | |")
                    continue
                mc = v["min_compute_ms"]
                ratio = f"{mc / best:.2f}x" if mc and best else "-"
                goal = f"{v['au_at_goal']:.1%}" if "au_at_goal" in v else "-"
                x = v["s3_bytes_per_epoch_x"]
                nbytes = f"{x:.3f}" if x is not None else "n/c"
                log(f"| {res['workload']} | {regime} | {n} | {v['nocompute_ms_per_batch']:.1f} | "
                    f"{f'{mc:.1f}' if mc else 'not reached'} | {ratio} | {goal} | {nbytes} |"
                    + (f" (failed later: {v['error']})" if "error" in v else ""))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset-mb", type=int, default=256, help="dataset size per workload (MB)")
    ap.add_argument("--workloads", default="small,large")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument("--reps", type=int, default=3, help="interleaved repeats per point (median)")
    ap.add_argument("--max-try-s", type=float, default=60.0, help="give up a ladder above this compute per epoch")
    ap.add_argument("--json", default=None)
    ap.add_argument("--litdata-direct", action="store_true", help="litdata reads moto directly (bytes n/c)")
    args = ap.parse_args()
    Litdata.direct = args.litdata_direct
    log = lambda m: print(m, flush=True)  # noqa: E731
    os.environ.update({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1", "TQDM_DISABLE": "1"})
    server = start_s3_server()
    proxies = {name: CountingProxy(server.endpoint) for name in args.systems.split(",")}
    scratch = tempfile.mkdtemp(prefix="trainstore-loader-s3-")
    results = []
    try:
        for wname in args.workloads.split(","):
            w = WORKLOADS[wname]
            samples = generate(w, args.dataset_mb << 20)
            total = samples.nbytes
            shard_rows = max(1, len(samples) // SHARDS)
            log(f"\n== {w.name}: {len(samples)} samples x {w.sample_bytes / 1e6:.2f} MB = {total / 1e6:.0f} MB, "
                f"batch {w.batch_size}, {shard_rows} samples per shard, {WORKERS} workers")
            bucket = f"bench-{uuid.uuid4().hex[:8]}"
            server.create_bucket(bucket)
            systems = {}
            for name in args.systems.split(","):
                s = SYSTEMS[name]()
                try:
                    s.write(Remote(bucket, server.endpoint, proxies[name].endpoint), samples, shard_rows, scratch)
                    systems[name] = s
                except Exception as exc:  # noqa: BLE001 - a peer that cannot run here is reported
                    log(f"  {name}: cannot run here: {type(exc).__name__}: {exc}")
            del samples
            gc.collect()
            bench = Bench(proxies, w, total, scratch, args.reps, args.max_try_s, log)
            res = {"workload": w.name, "dataset_bytes": total, "regimes": {}}
            for regime in args.regimes.split(","):
                log(f"  -- {regime}")
                res["regimes"][regime] = bench.regime(systems, regime)
            results.append(res)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(results, f, indent=1)
    finally:
        for proxy in proxies.values():
            proxy.stop()
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    report(results, log)


if __name__ == "__main__":
    main()
