"""Execute the book's pages in parallel into the execution cache, before Sphinx reads them.

myst-nb (``execute_notebooks: cache``) executes each page that jupyter-cache does not hold, one
after another, while Sphinx reads the pages. On two cores that leaves one idle while the longest
chapter runs. :func:`preexecute` runs every page that the cache does not hold in ``jobs`` worker
processes, the longest first (by the cold run times in ``data/chapter_resources.csv``), and stores
each executed notebook exactly as myst-nb's cache client would (same reader, same hash, same cwd, the
``execution_seconds`` record), so that Sphinx then finds every page in the cache and executes none.
A page is stored only when it executed without error; a failed page's traceback is returned for the
build's failure report. An interrupted run (Ctrl-C) stores the pages that had finished and nothing
else, and starts no other page (not even one already queued to a worker).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import yaml

from . import data
from .artifacts import atomic_write
from .rerun import _curve_kernel_manager  # kernels with CurveZMQ transport encryption, as reruns

REPO_ROOT = Path(__file__).resolve().parent.parent
# myst-nb's reader plugin (what NotebookClientCache records as the page's read format)
READ_DATA = {"type": "plugin", "name": "myst_nb_md"}


def _book_config(root: Path = REPO_ROOT) -> dict:
    return yaml.safe_load((root / "_config.yml").read_text()) or {}


def read_page(path: Path, root: Path = REPO_ROOT):
    """The notebook of a MyST page as myst-nb builds it for Sphinx (the extensions of
    ``_config.yml``), so that its jupyter-cache hash is the one Sphinx will look up."""
    from myst_nb.core.read import read_myst_markdown_notebook  # optional heavy dependency
    from myst_parser.config.main import MdParserConfig  # optional heavy dependency

    ext = (_book_config(root).get("parse") or {}).get("myst_enable_extensions") or []
    cfg = MdParserConfig(enable_extensions=set(ext))
    path = Path(path)
    if path.suffix == ".ipynb":
        import nbformat  # optional heavy dependency

        return nbformat.read(path, as_version=4)
    return read_myst_markdown_notebook(path.read_text("utf8"), config=cfg, add_source_map=True,
                                       path=str(path))


def pending(pages: list[Path], jcache: Path, root: Path = REPO_ROOT) -> list[Path]:
    """The pages whose notebook jupyter-cache does not hold (it would execute them)."""
    from jupyter_cache import get_cache  # optional heavy dependency

    cache = get_cache(str(jcache))
    out = []
    for p in pages:
        try:
            cache.match_cache_notebook(read_page(p, root))
        except KeyError:
            out.append(Path(p))
    return out


def expected_seconds(page: Path, root: Path = REPO_ROOT) -> float:
    """The page's last measured cold run time (``data/chapter_resources.csv``), 0 if unmeasured."""
    try:
        df = data.table("chapter_resources.csv")
    except Exception:  # no measurement yet: every page counts as short
        return 0.0
    rows = df[(df["chapter"] == Path(page).stem) & (df["status"] == "ok")]
    return float(rows["seconds"].max()) if not rows.empty else 0.0


_STOP = None  # in a worker: the event the build sets when it is interrupted


def _worker_init(stop) -> None:
    """A worker outlives Ctrl-C (dying, it would break the pool and the build would not stop
    cleanly): a page running when Ctrl-C comes stops (nbclient shuts its kernel down on SIGINT), and
    once the build has set ``stop`` the worker starts no other page, not even one already queued."""
    global _STOP
    _STOP = stop
    signal.signal(signal.SIGINT, _interrupted)


def _interrupted(signum, frame) -> None:
    """A worker's Ctrl-C: note it for the build (no other page starts, whatever the build's own
    process is doing at that moment) and carry on; the page's kernel got the signal too."""
    if _STOP is not None:
        _STOP.set()


def _execute(path: str, timeout: int | None, root: str,
             reads: str | None = None) -> tuple[str, object, float, str | None]:
    """Worker: execute one page in its own directory; returns (path, notebook, seconds, traceback).
    ``reads``: a file where the page's kernel lists every repository file it reads (analysis.data)."""
    from jupyter_cache.executors.utils import single_nb_execution  # optional heavy dependency

    if _STOP is not None and _STOP.is_set():
        return path, None, 0.0, "KeyboardInterrupt: not started, the build was interrupted (Ctrl-C)"
    if reads:
        Path(reads).write_text("")
        os.environ["KVBOOK_TRACE_READS"] = reads  # the kernel inherits this process's environment
    nb = read_page(Path(path), Path(root))
    t0 = time.perf_counter()
    try:
        res = single_nb_execution(nb, cwd=str(Path(path).parent), timeout=timeout, allow_errors=False,
                                  meta_override=True, kernel_manager_class=_curve_kernel_manager())
        seconds, tb = float(res.time), (res.exc_string if res.err is not None else None)
    except Exception:  # nbclient's own failure (e.g. a kernel that died under Ctrl-C): the page failed
        seconds, tb = time.perf_counter() - t0, traceback.format_exc()
    finally:
        if _STOP is not None:
            signal.signal(signal.SIGINT, _interrupted)  # nbclient leaves Python's default handler
    return path, nb, seconds, tb


def reads_file(reads_dir: Path, page: Path) -> Path:
    """Where :func:`preexecute` records the files a page read: ``<reads_dir>/<page stem>.json``."""
    return Path(reads_dir) / f"{Path(page).stem}.json"


def preexecute(pages: list[Path], jcache: Path, *, jobs: int = 2, root: Path = REPO_ROOT,
               timeout: int | None = None, log=print, reads_dir: Path | None = None,
               keys: dict | None = None) -> dict[str, str]:
    """Execute the ``pages`` the cache does not hold in ``jobs`` processes (longest first) and cache
    each one that succeeds. Returns ``{page path: traceback}`` for the pages that failed.

    With ``reads_dir``, each executed page's record of the repository files it read is written to
    :func:`reads_file` with ``keys[page]`` (its execution-cache key), for the test that every file a
    page reads is part of its key (``tests/test_notebooks.py``)."""
    from jupyter_cache import get_cache  # optional heavy dependency
    from jupyter_cache.base import CacheBundleIn  # optional heavy dependency

    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    if timeout is None:
        timeout = (_book_config(root).get("execute") or {}).get("timeout")
    todo = sorted(pending(pages, jcache, root), key=lambda p: -expected_seconds(p, root))
    if not todo:
        return {}
    if jobs > 1:
        # kernels side by side: idle OpenMP threads (numba, OpenBLAS) sleep instead of spinning on the
        # cores the other kernel needs (chapter 4's smoke run on 2 busy cores: 289 s spinning, 127 s not)
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    cache = get_cache(str(jcache))
    failed: dict[str, str] = {}
    t0 = time.perf_counter()
    log(f"executing {len(todo)} page(s) in {min(jobs, len(todo))} process(es): "
        + ", ".join(p.stem for p in todo))
    stop = multiprocessing.Event()
    with ProcessPoolExecutor(max_workers=min(jobs, len(todo)), initializer=_worker_init,
                             initargs=(stop,)) as pool:
        tmp = {}
        if reads_dir is not None:
            Path(reads_dir).mkdir(parents=True, exist_ok=True)
            tmp = {str(Path(p).resolve()): reads_file(reads_dir, p).with_suffix(".log") for p in todo}
        futs = [pool.submit(_execute, str(Path(p).resolve()), timeout, str(root),
                            str(tmp[str(Path(p).resolve())]) if tmp else None) for p in todo]
        try:
            for fut in as_completed(futs):
                path, nb, seconds, tb = fut.result()
                name = Path(path).stem
                if tmp:
                    log_file = tmp[path]
                    read = sorted(set(log_file.read_text().split())) if log_file.exists() else []
                    log_file.unlink(missing_ok=True)
                    if tb is None:
                        record = {"page": name, "key": (keys or {}).get(name), "reads": read}
                        atomic_write(reads_file(reads_dir, path), json.dumps(record, indent=1))
                if tb is not None:
                    failed[path] = tb
                    log(f"  failed   {name} after {seconds:.0f} s")
                    continue
                cache.add_nb_to_project(path, read_data=READ_DATA)
                cache.cache_notebook_bundle(CacheBundleIn(nb, path, data={"execution_seconds": seconds}),
                                            check_validity=False, overwrite=True)
                log(f"  executed {name} in {seconds:.0f} s")
        except BaseException:  # Ctrl-C: no other page starts; the running ones stop (their kernel got it)
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    if stop.is_set():  # a worker saw Ctrl-C that this process did not (it was not in its group)
        raise KeyboardInterrupt
    log(f"pages executed in {time.perf_counter() - t0:.0f} s")
    return failed


def default_jobs() -> int:
    """Worker processes for :func:`preexecute`: ``KVBOOK_BUILD_JOBS`` or the machine's cores, at most 4."""
    env = os.environ.get("KVBOOK_BUILD_JOBS")
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"KVBOOK_BUILD_JOBS must be a whole number of processes, got {env!r}") from None
        if n < 1:
            raise ValueError(f"KVBOOK_BUILD_JOBS must be at least 1, got {n}")
        return n
    return max(1, min(4, os.cpu_count() or 1))
