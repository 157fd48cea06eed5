"""Build the book: ``python -m analysis.build`` (what ``make book`` runs).

jupyter-cache re-executes a page only when its code cells change. A chapter's output also depends on
the modules of ``analysis`` it imports and on the files it reads, so each executable page has a key
(:func:`analysis.deps.chapter_key`: the source of the transitive closure of its imports inside
``analysis/`` and of the data files that closure reads, including the committed long-run artifacts
and frozen settings under ``results/`` that chapters read instead of computing). Before the build,
the cache records of every page whose key changed are removed, so that page, and only that page,
is executed again; the build says which pages re-execute and which changed files caused it. The
build treats warnings (and unresolved references, nitpicky) as errors; when a page fails, it ends by
printing, for each failed page, the exception and the last frames of its traceback, with a hint for
known errors.

An interrupted build (Ctrl-C) keeps every page that finished executing in the cache; the next build
executes only the others. A cache record whose notebook an interruption left missing or half
written is removed before the build (that page executes again), so it can neither stop the build
nor show a truncated page.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import deps, execute
from .artifacts import atomic_write

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD = REPO_ROOT / "_build"
JCACHE = BUILD / ".jupyter_cache"
KEYS = BUILD / ".chapter-keys.json"
OLD_STAMP = BUILD / ".analysis-hash"  # the whole-package key of earlier builds
REPORTS = BUILD / "html" / "reports"
READS = BUILD / "reads"  # per executed page: the repository files it read (analysis.execute)


def pages() -> list[Path]:
    """The executable pages of the book (``book/*.md`` with a kernelspec, ``book/*.ipynb``)."""
    files = sorted((REPO_ROOT / "book").glob("*.md")) + sorted((REPO_ROOT / "book").glob("*.ipynb"))
    return [p for p in files if deps.is_notebook(p)]


def _rel(p: Path) -> str:
    return p.resolve().relative_to(REPO_ROOT).as_posix()


def plan() -> dict[str, dict[str, str]]:
    """``{page: {dependency path: sha256}}`` for every executable page."""
    return {_rel(p): deps.fingerprint(deps.chapter_deps(p)) for p in pages()}


def changed_pages(old: dict, new: dict) -> dict[str, list[str]]:
    """Pages whose key changed, each with the dependencies that changed (``["no earlier key"]``
    for a page the last build did not key)."""
    out = {}
    for page, fp in new.items():
        before = old.get(page)
        if before is None:
            out[page] = ["no earlier key"]
            continue
        diff = sorted(k for k in set(fp) | set(before) if fp.get(k) != before.get(k))
        if diff:
            out[page] = diff
    return out


def _remove_record(cache, rec) -> None:
    """Remove a jupyter-cache record and its folder, even when its notebook file is missing (where
    jupyter-cache's ``remove_cache`` raises)."""
    from jupyter_cache.cache.db import NbCacheRecord  # optional heavy dependency

    shutil.rmtree(Path(cache.path) / "executed" / rec.hashkey, ignore_errors=True)
    NbCacheRecord.remove_records([rec.pk], cache.db)


def broken_records(cache) -> list:
    """The cache records whose executed notebook is missing or does not read whole: jupyter-cache
    records a page before it writes the notebook, so a build interrupted in between leaves one."""
    out = []
    for rec in cache.list_cache_records():
        try:
            cache.get_cache_bundle(rec.pk)
        except Exception:  # KeyError (no file), NotJSONError / ValueError (half written)
            out.append(rec)
    return out


def invalidate(verbose: bool = True) -> dict[str, list[str]]:
    """Remove the jupyter-cache records of the pages whose key changed (and of files no longer a
    page); record the new keys. Returns the changed pages with their changed dependencies."""
    new = plan()
    try:
        old = json.loads(KEYS.read_text()) if KEYS.exists() else {}
    except ValueError:
        old = {}
    changed = changed_pages(old, new)
    removed, cached = [], set()
    if JCACHE.exists():
        from jupyter_cache import get_cache  # optional heavy dependency

        cache = get_cache(str(JCACHE))
        for rec in broken_records(cache):
            _remove_record(cache, rec)
            if verbose:
                print(f"  removed a half-written cache entry of {Path(rec.uri).name} (an interrupted "
                      "build): it executes again")
        for rec in cache.list_cache_records():
            try:
                page = _rel(Path(rec.uri))
            except ValueError:
                page = None  # a record of another checkout: nothing vouches for it
            if page is None or page not in new or page in changed:
                _remove_record(cache, rec)
                removed.append(page or rec.uri)
            else:
                cached.add(page)
    BUILD.mkdir(exist_ok=True)
    atomic_write(KEYS, json.dumps(new, indent=1, sort_keys=True))
    OLD_STAMP.unlink(missing_ok=True)
    if verbose:
        for page in new:
            name = Path(page).stem
            if page in changed and old.get(page) is not None:
                what = ", ".join(changed[page][:4]) + (" ..." if len(changed[page]) > 4 else "")
                print(f"  re-execute {name}: changed {what}")
            elif page in cached:
                print(f"  reuse      {name}: its modules and data are unchanged")
            else:
                print(f"  execute    {name}: no cached run")
    return changed


# ------------------------------------------------------------------------------- failure report

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\w*\b:?")
_FRAME = re.compile(r"^(Cell In\[\d+\], line \d+|File \S.*:\d+, in .*|File \".*\", line \d+, in .*)$")

HINTS = [
    (re.compile(r"DataError|data file .* not found|KVBOOK_DATA"),
     "missing or unverified data: run `make data` on a machine with network access (it fetches and "
     "verifies every file of data/registry.yaml), or point KVBOOK_DATA at a folder holding the files "
     "(README, Data); KVBOOK_OFFLINE=1 forbids downloads."),
    (re.compile(r"ModuleNotFoundError|ImportError"),
     "a package is missing from the environment: `make install` (requirements.txt is pinned)."),
    (re.compile(r"ParameterError"),
     "a parameter is invalid: fix the chapter's parameters cell (`python -m analysis.rerun CHAPTER "
     "--list-params` lists what is allowed)."),
    (re.compile(r"SpecError|UnknownNameError"),
     "a row of data/models.csv or data/hardware.csv is invalid or a name is unknown: the message names it."),
    (re.compile(r"CellTimeoutError|TimeoutError"),
     "a cell ran past execute.timeout of _config.yml: a slower machine or a heavier default."),
    (re.compile(r"DeadKernelError|MemoryError|Kernel died"),
     "the kernel died, most often out of memory: see data/chapter_resources.csv for each chapter's peak."),
]


def summarize_failure(text: str, n_frames: int = 3) -> dict:
    """From a page's traceback report: the exception line, its last ``n_frames`` frames (header and
    the line marked ``-->``) and a hint for a known error."""
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    lines = [ln for ln in lines if not ln.startswith("[IPKernelApp]")]
    # the kernel's own traceback follows the failed cell's source (between dashed lines), if any
    start = 0
    dashes = [i for i, ln in enumerate(lines) if ln.strip() == "------------------"]
    if len(dashes) >= 2:
        start = dashes[1] + 1
    body = lines[start:]
    exc_i = None
    for i in range(len(body) - 1, -1, -1):
        if _EXC_LINE.match(body[i]) and not body[i].startswith(("File ", "Cell ")) \
                and "Traceback (most recent call last)" not in body[i]:
            exc_i = i
            break
    if exc_i is None:
        exc_lines = [ln for ln in body if ln.strip()][-1:] or ["(no exception line found)"]
        exc_i = len(body)
    else:
        exc_lines = [ln for ln in body[exc_i:exc_i + 8] if ln.strip()]
    frames = []
    for i, ln in enumerate(body[:exc_i]):
        if _FRAME.match(ln.strip()):
            frame = ln.strip()
            for nxt in body[i + 1:exc_i]:
                if _FRAME.match(nxt.strip()):
                    break
                if re.match(r"^\s*-+>", nxt):  # IPython marks the executing line with ---->
                    frame += f"\n      {nxt.strip()}"
                    break
            frames.append(frame)
    exception = "\n".join(exc_lines)
    hint = next((h for pat, h in HINTS if pat.search(exception)), None)
    return {"exception": exception, "frames": frames[-n_frames:], "hint": hint}


def failure_reports(since: float = 0.0) -> dict[str, dict]:
    """``{page: summary}`` for every traceback report written by this build."""
    out = {}
    if REPORTS.exists():
        for f in sorted(REPORTS.rglob("*.err.log")):
            if f.stat().st_mtime >= since:
                page = f.relative_to(REPORTS).as_posix()[: -len(".err.log")]
                out[page] = dict(summarize_failure(f.read_text(errors="replace")), report=str(f))
    return out


def print_failures(failures: dict[str, dict], file=None) -> None:
    file = file or sys.stdout
    if not failures:
        return
    print(f"\n{len(failures)} page(s) failed to execute (the glue warnings above follow from this):",
          file=file)
    for page, s in failures.items():
        print(f"\nFAILED {page}  (full traceback: {os.path.relpath(s['report'], REPO_ROOT)})", file=file)
        for fr in s["frames"]:
            print(f"  {fr}", file=file)
        for ln in s["exception"].splitlines():
            print(f"  {ln}", file=file)
        if s["hint"]:
            print(f"  hint: {s['hint']}", file=file)


INTERRUPTED = ("build interrupted: the pages that finished executing are cached; `make book` again "
               "executes only the others")


def _run_interruptible(cmd, **kw) -> int:
    """``subprocess.call``, except that on Ctrl-C the child (which got the SIGINT too) is given time
    to stop by itself, so that it does not die mid-write; a second Ctrl-C kills it."""
    with subprocess.Popen(cmd, **kw) as proc:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            try:
                proc.wait(timeout=60)
            except (KeyboardInterrupt, subprocess.TimeoutExpired):
                proc.kill()
            raise


def main(argv=None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print(f"\n{INTERRUPTED}", file=sys.stderr)
        return 130


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.build", description=__doc__.split("\n\n")[0])
    ap.add_argument("--builder", default="html", help="html (default) or linkcheck")
    ap.add_argument("--no-strict", action="store_true", help="do not treat warnings as errors")
    ap.add_argument("--jobs", type=int, default=None,
                    help="processes executing pages before Sphinx reads them (default: KVBOOK_BUILD_JOBS "
                         "or the machine's cores, at most 4)")
    a = ap.parse_args(argv)
    jobs = a.jobs if a.jobs is not None else execute.default_jobs()
    if jobs < 1:
        ap.error(f"--jobs must be at least 1, got {jobs}")
    print("execution cache (per page: its analysis/ modules and data files):")
    invalidate()
    if REPORTS.exists():
        shutil.rmtree(REPORTS)  # reports of earlier builds would be mistaken for this one's
    if a.builder == "html":
        # the pages the cache lacks run now, in parallel; Sphinx then reads every page from the cache
        keys = {Path(k).stem: deps.digest(v) for k, v in plan().items()}
        failed = execute.preexecute(pages(), JCACHE, jobs=jobs, root=REPO_ROOT, reads_dir=READS, keys=keys)
        if failed:
            for path, tb in failed.items():
                rep = REPORTS / (_rel(Path(path)).rsplit(".", 1)[0] + ".err.log")
                rep.parent.mkdir(parents=True, exist_ok=True)
                rep.write_text(tb)
            print_failures(failure_reports())
            print("the book was not rendered: fix the failed page(s) above and run `make book` again "
                  "(pages that executed are cached and will not run again)")
            return 1
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(exe), "build", str(REPO_ROOT), "--builder", a.builder]
    if not a.no_strict:
        cmd += ["-W", "-n", "--keep-going"]
    cmd += ["--all"]  # re-read every page so that no warning is hidden by an incremental build
    env = dict(os.environ)
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    t_start = time.time()
    t0 = time.perf_counter()
    rc = _run_interruptible(cmd, cwd=REPO_ROOT, env=env)
    print(f"jupyter-book {a.builder} build finished in {time.perf_counter() - t0:.0f} s with exit code {rc}")
    failures = failure_reports(since=t_start - 1)
    print_failures(failures)
    if rc == 0 and failures:
        rc = 1
    if rc == 0 and a.builder == "html":
        print(f"open {BUILD / 'html' / 'index.html'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
