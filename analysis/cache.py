"""On-disk cache of expensive results, keyed by a content hash of their inputs.

``cached(namespace, inputs, compute)`` (or ``cached(namespace, fn, **kwargs)`` for ``fn(**kwargs)``)
returns ``compute()`` and stores it under
``$KVBOOK_CACHE`` (default ``.cache/`` in the checkout) in a file named by the sha256 of
``namespace``, the JSON-canonical ``inputs`` and, by default, the code it runs: the source of the
modules of ``analysis`` that ``compute`` depends on (the module defining it and every module it
refers to, with their transitive imports and the data files they read; :mod:`analysis.deps`), so
a change to that code recomputes, an unchanged rebuild reuses, and an edit elsewhere in the package
(another chapter's subpackage) does not invalidate it; ``code=`` may also name the modules. Writes
are atomic (temporary file, then rename): an interrupted run never leaves a half-written entry. One
process at a time computes a given key (a lock file beside the entry): a second process asking for it
meanwhile waits and reads the first one's result instead of computing it again.
``@disk_cache`` wraps a function whose arguments are JSON-serialisable (numpy scalars and arrays
included).
"""
from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import inspect
import json
import os
import pickle
import tempfile
from pathlib import Path

import numpy as np

from . import deps

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = Path(__file__).resolve().parent


def cache_dir() -> Path:
    return Path(os.environ.get("KVBOOK_CACHE", REPO_ROOT / ".cache"))


def package_hash() -> str:
    """sha256 over the source of every module of ``analysis`` and the in-repo data tables (the
    fallback key of a computation whose code cannot be traced to modules of ``analysis``)."""
    h = hashlib.sha256()
    files = sorted(PACKAGE_DIR.rglob("*.py")) + sorted((REPO_ROOT / "data").glob("*.csv")) + sorted(
        (REPO_ROOT / "data").glob("*.yaml"))
    for f in files:
        h.update(str(f.relative_to(REPO_ROOT)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _default(o):
    if isinstance(o, np.ndarray):
        return {"__ndarray__": hashlib.sha256(np.ascontiguousarray(o).tobytes()).hexdigest(),
                "dtype": str(o.dtype), "shape": list(o.shape)}
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "__dataclass_fields__"):
        return dataclasses.asdict(o)
    raise TypeError(f"cannot hash {type(o).__name__} for the cache key; pass JSON-like inputs")


def code_hash(code, compute=None) -> str | None:
    """The code part of a key. ``code``: False (none), True (the modules ``compute`` depends on,
    :func:`analysis.deps.function_modules`; the whole package if none is found), or module names."""
    if code is False or code is None:
        return None
    if code is True:
        mods = deps.function_modules(compute) if compute is not None else set()
    else:
        mods = {code} if isinstance(code, str) else set(code)
    if not mods:
        return package_hash()
    return deps.digest(deps.fingerprint(deps.module_deps(sorted(mods))))


def key(namespace: str, inputs, *, code=True, compute=None) -> str:
    payload = json.dumps({"ns": namespace, "in": inputs, "code": code_hash(code, compute)},
                         sort_keys=True, default=_default)
    return hashlib.sha256(payload.encode()).hexdigest()


def cached(namespace: str, inputs, compute=None, *, code=True, enabled: bool | None = None, **kwargs):
    """Return ``compute()``, memoised on disk under the hash of ``(namespace, inputs, code)``.

    Second form, ``cached(namespace, fn, **kwargs)``: return ``fn(**kwargs)``, keyed by ``fn``'s name
    and ``kwargs`` (JSON-like, numpy and dataclasses included), so a chapter caches a package function
    without writing a lambda."""
    if callable(inputs) and compute is None:
        fn = inputs
        inputs = {"fn": f"{fn.__module__}.{fn.__qualname__}", "kwargs": kwargs}
        compute = functools.partial(fn, **kwargs)
    elif compute is None or kwargs:
        raise TypeError("cached(namespace, inputs, compute) or cached(namespace, fn, **kwargs)")
    if enabled is None:
        enabled = not os.environ.get("KVBOOK_NO_CACHE")
    if not enabled:
        return compute()
    k = key(namespace, inputs, code=code, compute=compute)
    path = cache_dir() / namespace / f"{k}.pkl"
    value = _load(path)
    if value is not _MISSING:
        return value
    # One process computes a key at a time: the book's pages execute in parallel, and a chapter and its
    # evidence page may ask for the same result; the second waits for the first and reads its entry.
    # The lock (flock) is released when its holder ends, however it ends; its file is removed once the
    # entry is written (a process that opens the lock file later finds the entry first).
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.parent / f".{k}.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            value = _load(path)
            if value is _MISSING:
                value = compute()
                _store(path, value)
        finally:
            lock_path.unlink(missing_ok=True)
    return value


_MISSING = object()


def _load(path: Path):
    """The entry at ``path``, or ``_MISSING`` (none, or a corrupt one, which is removed)."""
    if not path.is_file():
        return _MISSING
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)
    except Exception:  # corrupt entry (e.g. disk full earlier): recompute and overwrite
        path.unlink(missing_ok=True)
        return _MISSING


def _store(path: Path, value) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".pkl")
    try:
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def disk_cache(namespace: str, *, code=True):
    """Decorator form of :func:`cached`; the key is the function's bound arguments."""
    def deco(fn):
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            return cached(f"{namespace}", {"fn": fn.__qualname__, "args": dict(bound.arguments)},
                          functools.partial(fn, *args, **kwargs), code=code)
        wrapper.uncached = fn
        return wrapper
    return deco
