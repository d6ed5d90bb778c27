"""Where transform tasks run: ``local`` (this process, or a spawn process pool) or ``ray``.

An engine maps ``run_shard`` over tasks with at most ``workers`` running at once and yields
each result dict as it finishes. On the first failure the caller stops consuming and closes
the iterator; engines cancel what is still queued or running, and the Ray engine shuts down
a Ray it started itself (never one the caller started).

Ray on a multi-node cluster needs a store every node reaches: a local directory would make
each worker write shards to its own node's disk, so it is refused unless the caller says the
directory is shared (``store_shared=True``: the same path on a network file system).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

from ...errors import ConfigError
from .shard_task import ShardTask, run_shard

ENGINES = ("local", "ray")


def _url(task: ShardTask) -> str:
    return task.store if isinstance(task.store, str) else task.store.url


def check_store_shareable(task: ShardTask, workers: int, engine: str) -> None:
    url = _url(task)
    if (engine == "ray" or workers > 1) and url.startswith("memory://"):
        raise ConfigError(
            f"{url} lives in this process only; use workers=1 with engine='local', "
            "or a local directory / s3:// store"
        )


def check_ray_store(url: str, nodes: Sequence[Mapping[str, Any]], store_shared: bool) -> None:
    """Refuse a local-directory store when Ray has more than one live node (``nodes`` as
    ``ray.nodes()`` gives them), unless the caller declared the directory shared."""
    alive = [n for n in nodes if n.get("Alive", True)]
    if url.startswith("file://") and len(alive) > 1 and not store_shared:
        raise ConfigError(
            f"engine='ray' on a cluster of {len(alive)} nodes cannot use the local store {url}: "
            "each worker would write its shards to its own node's disk. Use an s3:// (gs://, "
            "az://) store, or pass TransformConfig(store_shared=True) if this path is a "
            "shared file system mounted at the same place on every node"
        )


def run_local(tasks: Sequence[ShardTask], workers: int,
              fn: Callable[..., Any] | None = None) -> Iterator[dict]:
    """workers == 1: in this process, in order, with ``fn`` when given (no import, no
    pickling). Otherwise a pool of spawned processes, each resolving the task's function."""
    if workers == 1:
        for task in tasks:
            yield run_shard(task, fn)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        todo = list(tasks)
        running = set()
        try:
            while todo or running:
                while todo and len(running) < workers:
                    running.add(pool.submit(run_shard, todo.pop(0)))
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    yield fut.result()
        finally:
            for fut in running:
                fut.cancel()


def run_ray(tasks: Sequence[ShardTask], workers: int, store_shared: bool = False) -> Iterator[dict]:
    """Ray tasks (one CPU each), at most ``workers`` in flight. Starts a local Ray
    (``num_cpus=workers``, no dashboard) when none is initialised, and stops it after."""
    try:
        import ray  # optional and slow to import: only when this engine runs
    except ImportError:
        raise ConfigError("engine='ray' needs ray: pip install 'trainstore[ray]'") from None
    started = False
    if not ray.is_initialized():
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        started = True
    running: list = []
    try:
        if tasks:
            check_ray_store(_url(tasks[0]), ray.nodes(), store_shared)
        remote = ray.remote(num_cpus=1, max_retries=0)(run_shard)
        todo = list(tasks)
        while todo or running:
            while todo and len(running) < workers:
                running.append(remote.remote(todo.pop(0)))
            done, running = ray.wait(running, num_returns=1)
            for ref in done:
                yield ray.get(ref)
    finally:
        for ref in running:
            ray.cancel(ref)
        if started:
            ray.shutdown()


def run_tasks(tasks: Sequence[ShardTask], engine: str, workers: int, *,
              fn: Callable[..., Any] | None = None, store_shared: bool = False) -> Iterator[dict]:
    """Results of ``tasks`` as they finish; close the iterator to cancel the rest.
    ``fn`` is the function object, used only by in-process runs."""
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {ENGINES}, got {engine!r}")
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    if tasks:
        check_store_shareable(tasks[0], workers, engine)
    if engine == "local":
        return run_local(tasks, workers, fn)
    return run_ray(tasks, workers, store_shared)
