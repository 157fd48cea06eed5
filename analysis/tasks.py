"""Run independent tasks here, in spawned processes, or on a Dask cluster: the one dispatcher of the
book's sweeps (:func:`analysis.rerun.run_sweep`) and long runs (:mod:`analysis.qevict.longrun_units`).

``run_tasks(fn, tasks, done, jobs=..., dask=...)`` calls ``fn(task)`` for every task and, as each one
finishes (in completion order), ``done(task, get)``: ``get()`` returns the result or raises the task's
error (an exception of ``fn``, a process that died, a lost Dask worker: ``KilledWorker``), so the caller
decides what a failure means. An exception that ``done`` raises, or Ctrl-C, stops the whole run:

* on Dask, the futures not yet finished are cancelled;
* in a process pool, no other task starts; with ``stop`` (an event of the pool's context that the
  workers' ``initializer`` received) the running tasks are asked to stop and waited for, otherwise
  their processes are terminated.

Processes are *spawned*, not forked: a process that has used OpenMP (numba) cannot be forked safely.
"""
from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import as_completed as cf_completed


def spawn_context():
    return mp.get_context("spawn")


def run_tasks(fn: Callable, tasks: Iterable, done: Callable, *, jobs: int = 1, dask: str | None = None,
              initializer: Callable | None = None, initargs: tuple = (), stop=None,
              on_client: Callable | None = None) -> None:
    """``fn(task)`` for each task; ``done(task, get)`` as each finishes (see the module's docstring).

    ``jobs``: processes when ``dask`` is None (1: in this process, in order). ``dask``: the scheduler's
    address. ``initializer``/``initargs``: run in each spawned worker process. ``stop``: an event the
    workers watch (set here when the run is interrupted; running tasks then end by themselves and are
    waited for). ``on_client(client)``: called once connected to Dask (e.g. to count its workers)."""
    tasks = list(tasks)
    if not tasks:
        return
    if dask:
        from distributed import Client, as_completed  # optional heavy dependency

        with Client(dask) as client:
            if on_client is not None:
                on_client(client)
            futures = client.map(fn, tasks, pure=False)
            task_of = {f.key: t for f, t in zip(futures, tasks)}
            try:
                for fut in as_completed(futures):
                    done(task_of[fut.key], fut.result)
            except BaseException:
                client.cancel(futures)
                raise
        return
    if jobs <= 1:
        for t in tasks:
            done(t, lambda t=t: fn(t))
        return
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=spawn_context(),
                               initializer=initializer, initargs=initargs)
    futs = {pool.submit(fn, t): i for i, t in enumerate(tasks)}
    try:
        for fut in cf_completed(futs):
            done(tasks[futs[fut]], fut.result)
    except BaseException:  # Ctrl-C or an error: no other task starts; the running ones stop
        if stop is not None:
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
        else:
            procs = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for p in procs:
                p.terminate()
        raise
    pool.shutdown()
