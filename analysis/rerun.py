"""Rerun chapters with other parameters through papermill.

    python -m analysis.rerun book/01_kv_footprint.md -p context_tokens 1048576 -p dtype fp8
    python -m analysis.rerun --sweep sweeps/kv_footprint_grid.yaml --jobs 2
    python -m analysis.rerun --sweep sweeps/kv_footprint_grid.yaml --dask tcp://HOST:PORT

A single run writes ``runs/<chapter>/<run-id>/`` holding the executed notebook, ``params.json`` and
``result.csv`` (one row: parameters + glued values). A sweep writes each run under
``runs/<sweep>/<run-id>/`` and one tidy ``runs/<sweep>/results.csv`` (one row per run, status and
error included), rewritten as each run finishes. Every parameter of every run is validated before
anything executes; duplicate points of a sweep run once. A run is written to a temporary directory
of its own (``<run-id>.partial-XXXX``) and renamed only when complete; a failed run is renamed
``<run-id>.failed`` with ``error.txt``, so no directory looks complete unless it is. A run holds a
lock on ``.owner`` in its temporary directory while it runs; the lock dies with its process, so a
temporary directory whose lock is free was left by a crash (a killed process, a lost Dask worker,
whose run Dask reschedules on another worker): a sweep removes such directories when it starts and
when it finishes, and reports them (printed, and in ``summary.json`` beside ``results.csv``). Each
``result.csv`` records the code hash and data hash of the chapter (:mod:`analysis.deps`), the commit
and the date; when a run fails, an earlier successful result of the same run id is moved to
``<run-id>.stale`` with ``STALE.txt`` saying why, so it cannot be mistaken for the current one.
``results.csv``, ``summary.json`` and ``STALE.txt`` are written whole or not at all
(:func:`analysis.artifacts.atomic_write`). Ctrl-C stops a local sweep at once: the runs in progress
stop (their temporary directories are removed next time), no queued run starts. ``--resume`` reruns
a sweep keeping each finished run whose
``result.csv`` holds the chapter's current code hash and data hash, and executes the others (missing,
failed, or computed with other code or data), saying which.

Sweep file format (YAML)::

    chapter: book/01_kv_footprint.md
    name: kv_footprint_grid          # optional, default: the file's stem
    fixed: {batch: 1}                # optional, applied to every run
    grid:                            # cartesian product
      dtype: [bf16, fp8]
      context_tokens: [32768, 1048576]
    runs:                            # optional explicit list of extra parameter sets
      - {dtype: fp4, context_tokens: 4096}
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import yaml
from tqdm.auto import tqdm

from . import chapters as _chapters
from . import deps
from . import params as _params
from . import tasks as tasks_mod
from .artifacts import atomic_write
from .report import glued_values

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "runs"


class RerunError(RuntimeError):
    """A chapter or sweep file cannot be run as given; the message says why and what to do."""


def chapter_path(chapter: str | os.PathLike) -> Path:
    p = Path(chapter)
    cands = [p, REPO_ROOT / p, REPO_ROOT / "book" / p, REPO_ROOT / "book" / f"{p}.md"]
    for c in cands:
        if c.is_file() and c.suffix in (".md", ".ipynb"):
            return c.resolve()
    known = sorted(x.name for x in (REPO_ROOT / "book").glob("[0-9][0-9]_*.md"))
    raise RerunError(f"chapter {str(chapter)!r} not found; chapters: {', '.join(known)}")


def run_id(chapter: str, values: dict) -> str:
    """Deterministic id of a run: the chapter stem and a short hash of its parameters."""
    digest = hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{Path(chapter).stem}-{digest}"


def prepare(chapter, overrides: dict) -> tuple[Path, dict]:
    """Resolve the chapter and validate the overrides against its schema (raises ParameterError)."""
    path = chapter_path(chapter)
    schema = _chapters.schema(path.stem)
    full = _params.validate(schema, overrides, partial=True)
    return path, {k: full[k] for k in overrides}


def _read_notebook(path: Path):
    import jupytext  # optional heavy dependency
    import nbformat  # optional heavy dependency

    nb = jupytext.read(path) if path.suffix == ".md" else nbformat.read(path, as_version=4)
    nb.metadata.setdefault("kernelspec",
                           {"name": "python3", "display_name": "Python 3", "language": "python"})
    if not any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb.cells):
        raise RerunError(f"{path} has no cell tagged 'parameters'")
    return nb


def _curve_kernel_manager():
    """The kernel manager for reruns: CurveZMQ transport encryption for kernels that declare it
    (ipykernel does), so kernels neither run unencrypted over TCP nor warn that they do."""
    from jupyter_client.manager import AsyncKernelManager  # optional heavy dependency
    from traitlets import default  # optional heavy dependency

    class CurveKernelManager(AsyncKernelManager):
        @default("transport_encryption")
        def _transport_encryption_default(self):
            return "auto"

    return CurveKernelManager


def provenance(path: Path) -> dict:
    """Code hash (the chapter and the modules it runs), data hash (the files they read), commit
    and date of a run, for its ``result.csv``."""
    d = deps.chapter_deps(path)
    fp = deps.fingerprint(d)
    code = {k: v for k, v in fp.items() if k.endswith(".py")}
    code[path.name] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    data = {k: v for k, v in fp.items() if not k.endswith(".py")}
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"code_hash": deps.digest(code)[:16], "data_hash": deps.digest(data)[:16], "commit": commit,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def _replace_dir(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``, replacing a ``dst`` that exists (moved aside, then removed); safe
    when another run renames onto ``dst`` at the same time (the last one wins, whole)."""
    for _ in range(10):
        try:
            src.rename(dst)
            return
        except OSError:
            if not dst.exists():
                raise
            old = dst.with_name(f"{dst.name}.old-{uuid.uuid4().hex[:8]}")
            try:
                dst.rename(old)
            except FileNotFoundError:
                continue  # another run moved it first
            shutil.rmtree(old, ignore_errors=True)
    src.rename(dst)


def execute(chapter, overrides: dict, out_dir, *, kernel: str = "python3", timeout_s: int = 3600,
            progress: bool = False) -> dict:
    """Execute one chapter with ``overrides`` into ``out_dir/<run-id>``; returns the result row.

    Never raises for a failure inside the notebook: the row has ``status='failed'`` and ``error``."""
    path, overrides = prepare(chapter, overrides)
    rid = run_id(path.stem, overrides)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{rid}.partial-", dir=out_dir))  # never shared by two runs
    owner = _hold_partial(partial)
    try:
        return _execute_in(path, overrides, rid, partial, out_dir, kernel=kernel, timeout_s=timeout_s,
                           progress=progress)
    finally:
        owner.close()  # the lock ends here (or with the process, if it is killed)


def _execute_in(path: Path, overrides: dict, rid: str, partial: Path, out_dir: Path, *, kernel: str,
                timeout_s: int, progress: bool) -> dict:
    import papermill as pm  # optional heavy dependency

    final, failed, stale = out_dir / rid, out_dir / f"{rid}.failed", out_dir / f"{rid}.stale"
    prov = provenance(path)
    row = {"run_id": rid, "chapter": path.name, **{f"param.{k}": v for k, v in overrides.items()}, **prov}
    (partial / "params.json").write_text(
        json.dumps({"chapter": path.name, "parameters": overrides, **prov}, indent=2))
    t0 = time.perf_counter()
    nb_out = partial / f"{path.stem}.ipynb"
    try:
        nb = _read_notebook(path)
        for attempt in range(3):
            try:
                pm.execute_notebook(nb, str(nb_out), parameters=overrides, kernel_name=kernel,
                                    cwd=str(path.parent), progress_bar=progress,
                                    execution_timeout=timeout_s, log_output=False,
                                    kernel_manager_class=_curve_kernel_manager())
                break
            except pm.PapermillExecutionError:
                raise  # an error inside the chapter: report it, never retry
            except Exception as exc:  # kernel start-up races (ports, ZMQ) under parallel runs
                if attempt == 2 or "kernel" not in f"{type(exc).__name__} {exc}".lower():
                    raise
                # a kernel that died of the sweep's Ctrl-C is not a start-up race: never run it again
                if _STOP is not None and _STOP.wait(timeout=1.0 + attempt):
                    raise KeyboardInterrupt from exc
                if _STOP is None:
                    time.sleep(1.0 + attempt)
        import nbformat  # optional heavy dependency
        values = glued_values(nbformat.read(nb_out, as_version=4))
        row.update(status="ok", error="", seconds=round(time.perf_counter() - t0, 2))
        row.update({f"glue.{k}": v for k, v in values.items()})
        _write_row(partial / "result.csv", row)
        (partial / OWNER).unlink()  # complete: nothing of the lock goes with it (its fd is kept)
        _replace_dir(partial, final)
        for d in (failed, stale):  # an older failure or stale result no longer describes this run
            shutil.rmtree(d, ignore_errors=True)
        row["path"] = str(final)
    except Exception as exc:  # the notebook failed: keep what it wrote, marked as failed
        if _interrupted(exc):  # stopped by the sweep's Ctrl-C: leave the partial (removed next time)
            raise KeyboardInterrupt from exc  # and any earlier result of this run id as they are
        msg = _short_error(exc)
        row.update(status="failed", error=msg, seconds=round(time.perf_counter() - t0, 2))
        (partial / "error.txt").write_text(msg + "\n\n" + traceback.format_exc())
        (partial / OWNER).unlink(missing_ok=True)
        _replace_dir(partial, failed)
        row["path"] = str(failed)
        if final.exists():  # an earlier success must not look current: move it aside, say why
            _replace_dir(final, stale)
            atomic_write(stale / "STALE.txt", (
                f"Superseded: a later run of these parameters failed on {row['date']} (code hash "
                f"{row['code_hash']}, data hash {row['data_hash']}, commit {row['commit'] or '?'}): "
                f"see ../{failed.name}/error.txt. This result.csv is from an earlier run.\n"))
            row["stale"] = str(stale)
    return row


OWNER = ".owner"  # in a run's temporary directory: locked by the process running it
PARTIAL_GRACE_S = 3600  # a temporary directory without an owner file (older code) is stale after this


def _hold_partial(partial: Path):
    """Lock ``partial/.owner`` for as long as the returned file stays open (the lock is released by
    the operating system when the process dies, however it dies)."""
    fh = open(partial / OWNER, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass  # a file system without locks: the directory's age decides (PARTIAL_GRACE_S)
    fh.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                         "started": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}) + "\n")
    fh.flush()
    return fh


def _is_abandoned(partial: Path, now: float) -> bool:
    """Whether no live process is writing the temporary directory ``partial``."""
    owner = partial / OWNER
    try:
        fh = open(owner, "r")
    except FileNotFoundError:
        try:
            return now - partial.stat().st_mtime > PARTIAL_GRACE_S
        except FileNotFoundError:
            return False  # renamed to its final name meanwhile
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its run is alive
        except OSError:
            return now - owner.stat().st_mtime > PARTIAL_GRACE_S
        fcntl.flock(fh, fcntl.LOCK_UN)
        return True


def clean_partials(out_dir) -> list[str]:
    """Remove what crashed runs left in ``out_dir``: temporary run directories (``*.partial-*``) no
    live process holds, leftovers of an interrupted replacement (``*.old-*``) and temporary files of
    an interrupted table write older than a minute. Returns the names removed (sorted)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    now, removed = time.time(), []
    for p in sorted(out_dir.iterdir()):
        if p.is_dir() and ".partial-" in p.name:
            stale = _is_abandoned(p, now)
        elif p.is_dir() and ".old-" in p.name:
            stale = True
        elif p.is_file() and p.name.startswith(".") and p.name.endswith(".tmp"):
            stale = now - p.stat().st_mtime > 60
        else:
            continue
        if stale:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            if not p.exists():
                removed.append(p.name)
    return removed


def _short_error(exc: Exception) -> str:
    name = getattr(exc, "ename", type(exc).__name__)
    value = getattr(exc, "evalue", str(exc))
    return f"{name}: {value}".strip()[:2000]


def _write_row(path: Path, row: dict) -> None:
    pd.DataFrame([row]).to_csv(path, index=False)


# ------------------------------------------------------------------------------------------ sweeps

def load_sweep(file) -> tuple[Path, str, list[dict]]:
    """Parse and validate a sweep file; returns (chapter path, sweep name, list of overrides)."""
    file = Path(file)
    if not file.is_file():
        known = ", ".join(sorted(p.name for p in (REPO_ROOT / "sweeps").glob("*.yaml")))
        raise RerunError(f"sweep file {file} not found; sweeps: {known}")
    try:
        spec = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as exc:
        raise RerunError(f"{file} is not valid YAML: {exc}") from exc
    unknown = set(spec) - {"chapter", "name", "fixed", "grid", "runs", "description"}
    if unknown:
        raise RerunError(f"{file}: unknown keys {sorted(unknown)}; "
                         "allowed: chapter, name, description, fixed, grid, runs")
    if "chapter" not in spec:
        raise RerunError(f"{file}: missing 'chapter: book/NN_slug.md'")
    path = chapter_path(spec["chapter"])
    fixed = spec.get("fixed") or {}
    grid = spec.get("grid") or {}
    for k, v in grid.items():
        if not isinstance(v, list) or not v:
            raise RerunError(f"{file}: grid.{k} must be a non-empty list of values")
    combos = itertools.product(*grid.values()) if grid else []
    points = [dict(fixed, **dict(zip(grid, combo))) for combo in combos]
    points += [dict(fixed, **r) for r in (spec.get("runs") or [])]
    if not points:
        points = [dict(fixed)]
    schema = _chapters.schema(path.stem)
    errors = []
    for i, p in enumerate(points):
        try:
            _params.validate(schema, p, partial=True)
        except _params.ParameterError as exc:
            errors.append(f"run {i} {p}: {exc}")
    if errors:
        raise _params.ParameterError(f"{file}: {len(errors)} of {len(points)} runs are invalid, "
                                     "nothing was run:\n" + "\n".join(errors))
    unique, seen = [], set()
    for p in points:  # a point given twice (grid and runs, or a repeated value) runs once
        rid = run_id(path.stem, prepare(path, p)[1])
        if rid not in seen:
            seen.add(rid)
            unique.append(p)
    return path, str(spec.get("name") or file.stem), unique


_STOP = None  # in a sweep's worker process: the event the sweep sets when it is interrupted (Ctrl-C)
_RUNNING = False  # in a sweep's worker process: a run is executing


def _worker_init(stop) -> None:
    """A sweep's worker outlives Ctrl-C when idle (dying, it would break the pool): the run it
    executes stops (KeyboardInterrupt), and once the sweep has set ``stop`` it starts no other run."""
    global _STOP
    _STOP = stop
    signal.signal(signal.SIGINT, _on_ctrl_c)


def _on_ctrl_c(signum, frame) -> None:
    """SIGINT in a sweep's worker: stop the run it executes; nothing when idle."""
    if _RUNNING:
        raise KeyboardInterrupt


def _interrupted(exc: Exception) -> bool:
    """Whether a run that failed with ``exc`` in a sweep's worker was stopped by the sweep's Ctrl-C
    rather than failing by itself (an error the chapter raised is never an interruption)."""
    if _STOP is None or getattr(exc, "ename", "KeyboardInterrupt") != "KeyboardInterrupt":
        return False
    return _STOP.wait(timeout=5)


def _execute_star(args):
    if _STOP is not None and _STOP.is_set():
        raise RerunError("not started: the sweep was interrupted")
    global _RUNNING
    chapter, overrides, out_dir, kernel, timeout_s = args
    _RUNNING = True
    try:
        return execute(chapter, overrides, out_dir, kernel=kernel, timeout_s=timeout_s)
    finally:
        _RUNNING = False
        if _STOP is not None:  # papermill (nbclient) may leave Python's default handler behind
            signal.signal(signal.SIGINT, _on_ctrl_c)


def _crashed_row(task, exc) -> dict:
    chapter, overrides = task[0], task[1]
    path, ov = prepare(chapter, overrides)
    return {"run_id": run_id(path.stem, ov), "chapter": path.name, **{f"param.{k}": v for k, v in ov.items()},
            "status": "failed", "error": f"worker crashed: {_short_error(exc)}", "seconds": float("nan")}


def _write_results(rows: list[dict], order: dict, out_dir: Path):
    """Write ``results.csv`` atomically, rows in the sweep's order (called as each run finishes)."""
    df = pd.DataFrame(sorted(rows, key=lambda r: order.get(r["run_id"], 0)))
    atomic_write(out_dir / "results.csv", write=lambda tmp: df.to_csv(tmp, index=False))
    return df


def _finished(out_dir: Path, rid: str, prov: dict) -> dict | None:
    """The result row of a finished run ``rid`` if it was computed with the current code and data
    (``prov``), else None."""
    f = out_dir / rid / "result.csv"
    try:
        row = pd.read_csv(f).iloc[0].to_dict()
    except (OSError, ValueError, IndexError, pd.errors.EmptyDataError):
        return None
    if row.get("status") != "ok" or any(str(row.get(k)) != prov[k] for k in ("code_hash", "data_hash")):
        return None
    row["path"] = str(out_dir / rid)
    return row


def run_sweep(file, *, jobs: int = 2, out_root=DEFAULT_OUT, dask: str | None = None, kernel: str = "python3",
              timeout_s: int = 3600, progress: bool = True, resume: bool = False):
    """Run every distinct point of a sweep; returns the results table (pandas DataFrame), which is
    also written to ``<out_root>/<sweep>/results.csv`` after each finished run (a crash loses nothing
    that finished; a crashed worker's run is a failed row). ``resume``: keep each finished run whose
    result holds the current code and data hashes instead of executing it again. Temporary
    directories of crashed runs are removed when the sweep starts and when it ends; what was removed
    and kept is in ``df.attrs["summary"]`` and ``summary.json``."""
    path, name, points = load_sweep(file)
    out_dir = Path(out_root) / name
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {"sweep": name, "chapter": path.name, "runs": len(points),
               "started": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
               "removed_before": clean_partials(out_dir)}
    _report_removed(summary["removed_before"], "before the sweep", progress)
    order = {run_id(path.stem, prepare(path, p)[1]): i for i, p in enumerate(points)}
    rows: list[dict] = []
    if resume:
        prov = provenance(path)
        kept = {}
        for p in points:
            row = _finished(out_dir, run_id(path.stem, prepare(path, p)[1]), prov)
            if row is not None:
                kept[row["run_id"]] = row
        points = [p for p in points if run_id(path.stem, prepare(path, p)[1]) not in kept]
        rows += kept.values()
        summary["resumed"] = sorted(kept)
        if progress:
            print(f"{name}: {len(kept)} finished run(s) kept (current code and data), {len(points)} to run",
                  file=sys.stderr)
    tasks = [(str(path), p, str(out_dir), kernel, timeout_s) for p in points]
    summary["executed"] = sorted(run_id(path.stem, prepare(path, p)[1]) for p in points)
    bar = tqdm(total=len(tasks), desc=name, unit="run", disable=not progress, file=sys.stderr)

    def done(task, get):
        try:
            rows.append(get())
        except Exception as exc:  # the worker died (killed, out of memory, lost Dask worker)
            rows.append(_crashed_row(task, exc))
        _write_results(rows, order, out_dir)
        bar.update()

    stop = tasks_mod.spawn_context().Event() if jobs > 1 and not dask else None
    tasks_mod.run_tasks(_execute_star, tasks, done, jobs=jobs, dask=dask, initializer=_worker_init,
                        initargs=(stop,), stop=stop)
    bar.close()
    df = _write_results(rows, order, out_dir)
    summary["removed_after"] = clean_partials(out_dir)
    _report_removed(summary["removed_after"], "after the sweep", progress)
    summary.update(finished=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                   ok=int((df["status"] == "ok").sum()) if len(df) else 0,
                   failed=int((df["status"] != "ok").sum()) if len(df) else 0)
    atomic_write(out_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
    df.attrs["summary"] = summary
    return df


def _report_removed(names: list[str], when: str, progress: bool) -> None:
    if names and progress:
        print(f"removed {len(names)} temporary director(ies) or file(s) left by crashed runs {when} "
              f"(nothing finished is lost: a run is renamed only when complete): {', '.join(names)}",
              file=sys.stderr)


# --------------------------------------------------------------------------------------------- CLI

def _parse_value(text: str):
    """A ``-p`` value is read as YAML: 12 -> int, 1.5 -> float, true -> bool, [a, b] -> list."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.rerun", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chapter", nargs="?", help="chapter file, e.g. book/01_kv_footprint.md")
    ap.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"), default=[],
                    help="parameter override (VALUE read as YAML); repeatable")
    ap.add_argument("--sweep", help="sweep file (YAML), e.g. sweeps/kv_footprint_grid.yaml")
    ap.add_argument("--jobs", type=int, default=2, help="parallel local runs for a sweep (default 2)")
    ap.add_argument("--dask", metavar="ADDRESS", help="run a sweep on a Dask cluster, e.g. tcp://HOST:8786")
    ap.add_argument("--resume", action="store_true",
                    help="sweep: keep finished runs computed with the current code and data, run the rest")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="output root (default runs/)")
    ap.add_argument("--kernel", default="python3")
    ap.add_argument("--timeout", type=int, default=3600, help="per-cell timeout in seconds")
    ap.add_argument("--list-params", action="store_true", help="print the chapter's parameters and exit")
    a = ap.parse_args(argv)
    try:
        if a.sweep:
            if a.chapter or a.parameter:
                raise RerunError("give either a chapter with -p overrides, or --sweep, not both")
            if a.jobs < 1:
                raise RerunError("--jobs must be >= 1")
            try:
                df = run_sweep(a.sweep, jobs=a.jobs, out_root=a.out, dask=a.dask, kernel=a.kernel,
                               timeout_s=a.timeout, resume=a.resume)
            except KeyboardInterrupt:
                out = Path(a.out) / load_sweep(a.sweep)[1]
                print(f"\nsweep interrupted: the runs that finished are in {out}/ and its results.csv; "
                      "the same command with --resume executes only the others", file=sys.stderr)
                return 130
            failed = df[df["status"] != "ok"]
            out = Path(a.out) / load_sweep(a.sweep)[1] / "results.csv"
            print(f"{len(df) - len(failed)} of {len(df)} runs succeeded; results table: {out}")
            for _, r in failed.iterrows():
                ps = {k[6:]: r[k] for k in r.index if k.startswith("param.")}
                print(f"FAILED {r['run_id']} {ps}: {r['error']}", file=sys.stderr)
            return 1 if len(failed) else 0
        if not a.chapter:
            ap.error("give a chapter (book/NN_slug.md) or --sweep FILE")
        if a.list_params:
            print(_chapters.schema(chapter_path(a.chapter).stem).describe(full=True))
            return 0
        overrides = {}
        for name, value in a.parameter:
            overrides[name] = _parse_value(value)
        path, overrides = prepare(a.chapter, overrides)
        _report_removed(clean_partials(Path(a.out) / path.stem), "before this run", True)
        row = execute(path, overrides, Path(a.out) / path.stem, kernel=a.kernel, timeout_s=a.timeout,
                      progress=True)
        if row["status"] != "ok":
            print(f"FAILED {row['run_id']} {overrides}: {row['error']} (details: {row['path']}/error.txt)",
                  file=sys.stderr)
            if row.get("stale"):
                print(f"the earlier result of this run id was moved to {row['stale']} (STALE.txt)",
                      file=sys.stderr)
            return 1
        print(f"ok: {row['path']} ({row['seconds']} s); result row: {row['path']}/result.csv")
        return 0
    except (_params.ParameterError, RerunError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
