"""Where transform tasks run: ``local`` (this process, or a spawn process pool) or ``ray``.

An engine maps ``run_shard`` over tasks with at most ``workers`` running at once and yields
each result dict as it finishes. On the first failure the caller stops consuming; engines
cancel what has not started.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from ..errors import ConfigError
from .transform_shard import ShardTask, run_shard

ENGINES = ("local", "ray")


def check_store_shareable(task: ShardTask, workers: int, engine: str) -> None:
    url = task.store if isinstance(task.store, str) else task.store.url
    if (engine == "ray" or workers > 1) and url.startswith("memory://"):
        raise ConfigError(
            f"{url} lives in this process only; use workers=1 with engine='local', "
            "or a local directory / s3:// store"
        )


def run_local(tasks: Sequence[ShardTask], workers: int) -> Iterator[dict]:
    """workers == 1: in this process, in order. Otherwise a pool of spawned processes."""
    if workers == 1:
        for task in tasks:
            yield run_shard(task)
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


def run_ray(tasks: Sequence[ShardTask], workers: int) -> Iterator[dict]:
    """Ray tasks (one CPU each), at most ``workers`` in flight. Starts a local Ray
    (``num_cpus=workers``, no dashboard) when none is initialised, and stops it after."""
    try:
        import ray
    except ImportError:
        raise ConfigError("engine='ray' needs ray: pip install 'trainstore[ray]'") from None
    started = False
    if not ray.is_initialized():
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
        started = True
    remote = ray.remote(num_cpus=1, max_retries=0)(run_shard)
    todo = list(tasks)
    running: list = []
    try:
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


def run_tasks(tasks: Sequence[ShardTask], engine: str, workers: int) -> Iterator[dict]:
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {ENGINES}, got {engine!r}")
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    if tasks:
        check_store_shareable(tasks[0], workers, engine)
    return run_local(tasks, workers) if engine == "local" else run_ray(tasks, workers)
