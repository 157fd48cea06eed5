"""Chapter 4's long runs by units: resumable, on local processes or a Dask cluster.

    python -m analysis.qevict.longrun_units sweeps/qevict_long.yaml --jobs 2            (= make long)
    python -m analysis.qevict.longrun_units sweeps/qevict_long.yaml --only NAME --dask tcp://HOST:8786
    python -m analysis.qevict.longrun_units sweeps/qevict_long.yaml --only NAME --fresh

Each entry of the YAML's ``runs`` (one model, a list of documents) is the artifact ``results/<name>/``
that :mod:`analysis.qevict.longrun` defines; this driver (its one command) splits it into **units**, one per
(document, model), and computes each with :func:`longrun.execute` on that document alone
(``run`` with ``documents=[doc]``).  A unit's tables are those rows of the whole run's: the per-document
rows of ``summary``, ``timings``, ``drift`` and ``drift_ends`` are computed by the same function on the
same document whatever else runs (one BLAS and one numba thread per unit, as the committed artifacts
were computed), and ``settings`` does not depend on the documents; the artifact is the
units' tables concatenated in the run's document order, written by :func:`analysis.artifacts.write_artifact`
with the same modules (``longrun.MODULES`` and the model's module) and so the same code hash.

**Units on disk.** Each finished unit is written, as soon as it finishes, to
``results/<name>.units/<document>.<hash>.unit.pkl`` (committed: a regeneration longer than one machine's
session goes on from main wherever the same command runs next; see :func:`progress` and the sweep's
``regenerating`` declaration) by the driver, whole or not at all
(:func:`analysis.artifacts.atomic_write`), with its document, model, the code hash of the modules that
computed it, a hash of the run's parameters, the sha256 of the tuned-settings file, its tables and its
compute time.  A rerun of the same entry keeps each unit whose code hash and settings hash are current,
recomputes the stale ones (saying which and why),
and computes the missing ones; units left by a run with other parameters are refused (the message says
to pass ``--fresh`` or remove the folder).  An interrupted run (Ctrl-C, a killed process, a lost machine)
loses only the units in progress: the same command resumes, and gives the same tables, bit for bit,
as a run never interrupted (``timings``, wall clock and memory, excepted).

**Dask.** ``--dask ADDRESS`` sends the units to a Dask scheduler; each unit's tables come back to the
driver, which writes them (workers need the repository and the data, not a shared ``results/``).  A
worker that dies loses only its unit in progress: Dask runs it again on another worker (up to
``distributed.scheduler.allowed-failures``); past that the unit is reported as failed, the others
still finish and are kept, and the artifact is written once a rerun has computed every unit.  A worker
whose code hashes differently from the driver's is refused.  A worker process runs one unit at a
time (``longrun.execute`` keeps the run in a module global); start workers with ``--nthreads 1``.

The scheduler is outside the artifact's code hash on purpose: it decides where and when a unit runs,
never what it computes (``tests/test_qevict_longrun_units.py`` checks that an interrupted and resumed
run, a run of all units at once and ``longrun.execute`` over all documents write the same tables).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import hashlib
import importlib
import json
import os
import pickle
import re
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

import numba
import numpy as np
import pandas as pd
import yaml

from analysis.artifacts import REPO_ROOT, atomic_write, code_hash, results_dir, write_artifact
from analysis.tasks import run_tasks

from . import longrun
from .runner import _blas_threads

UNIT_FORMAT = 1
# environment variable naming a loader "module:function" that replaces longrun.load (model name ->
# (model, tokenizer)); tests inject tiny random-weight models with it (tests/_tiny_model.py)
LOADER_ENV = "KVBOOK_LONGRUN_LOADER"
# keys of a run that do not change what any unit computes
NOT_PARAMS = ("name", "documents", "notes")
ENTRY = "python -m analysis.qevict.longrun_units"


class LongRunError(RuntimeError):
    """A long run cannot go on as asked; the message says why and what to do."""


# ------------------------------------------------------------------------------------- unit keys

def modules(r: dict) -> list[str]:
    """The modules whose source keys the run's artifact and its units."""
    return longrun.MODULES + [longrun.MODEL_MODULES[r["model"]]]


def params_of(r: dict) -> dict:
    """The checked run's parameters that decide a unit's numbers (all but its name, documents, notes)."""
    return {k: v for k, v in sorted(r.items()) if k not in NOT_PARAMS}


def params_hash(r: dict) -> str:
    return hashlib.sha256(json.dumps(params_of(r), sort_keys=True, default=str).encode()).hexdigest()


def settings_sha(r: dict) -> str:
    """sha256 of the (checked) run's tuned-settings file ("none" without one)."""
    path = r["tuned_settings"]
    if path in (None, "none"):
        return "none"
    path = Path(path) if Path(path).is_absolute() else REPO_ROOT / path  # as the runs name it, from the root
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:
        raise LongRunError(f"run {r['name']!r}: cannot read tuned_settings {path!r} ({e}); give an existing "
                           "file or 'none'") from e


def units_dir(name: str) -> Path:
    return results_dir() / f"{name}.units"


def unit_path(folder: Path, document: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9_-]+", "_", document)[:48].strip("_")
    return folder / f"{slug}.{hashlib.sha256(document.encode()).hexdigest()[:10]}.unit.pkl"


# ------------------------------------------------------------------------------ computing a unit

_ONE_AT_A_TIME = threading.Lock()  # longrun.execute keeps the run in a module global: one unit per process


def _loader(name: str | None):
    if not name:
        return longrun.load
    mod, _, attr = name.partition(":")
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
        raise LongRunError(f"loader {name!r} ({LOADER_ENV}) not found: {e}; give 'module:function'") from e


@contextlib.contextmanager
def _using_loader(name: str | None):
    """longrun.load replaced by the loader ``name`` for the duration (no-op without one)."""
    if not name:
        yield
        return
    old = longrun.load
    longrun.load = _loader(name)
    try:
        yield
    finally:
        longrun.load = old


def compute_unit(task: dict) -> dict:
    """Compute one unit (in a local worker process, a Dask worker, or the driver): the unit record
    (without writing it; the driver does).  ``task``: run (checked), document, loader, verbose."""
    r, doc = task["run"], task["document"]
    with _ONE_AT_A_TIME:
        before = code_hash(modules(r))
        t0 = time.perf_counter()
        threads = numba.get_num_threads()
        numba.set_num_threads(1)  # one thread per unit, as the committed artifacts were computed
        try:
            with _blas_threads(1), _using_loader(task.get("loader")), np.errstate(all="ignore"):
                tables = longrun.execute(dict(r, documents=[doc]), verbose=task.get("verbose", False), jobs=1)
        finally:
            numba.set_num_threads(threads)
        seconds = time.perf_counter() - t0
        if code_hash(modules(r)) != before:
            raise LongRunError(f"{r['name']} / {doc}: the code changed while the unit ran; run it again")
    return dict(format=UNIT_FORMAT, name=r["name"], model=r["model"], document=doc, code_hash=before,
                params_hash=params_hash(r), params=params_of(r), settings_sha=settings_sha(r), tables=tables,
                seconds=round(seconds, 1), host=socket.gethostname(), pid=os.getpid(),
                written=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat())


def precheck(r: dict, loader: str | None) -> None:
    """:func:`longrun.prepare` (the checks :func:`longrun.execute` makes before any work) for all the
    run's documents at once, before the first unit starts."""
    with _using_loader(loader):
        longrun.prepare(r)


# ------------------------------------------------------------------------------ the unit store

def _read_unit(path: Path):
    """The record at ``path``, or the reason it cannot be used."""
    try:
        with open(path, "rb") as fh:
            rec = pickle.load(fh)
    except Exception as e:  # truncated, or written by an incompatible pandas
        return None, f"unreadable ({type(e).__name__}: {e})"
    if not isinstance(rec, dict) or rec.get("format") != UNIT_FORMAT:
        return None, "written in another unit format"
    return rec, None


def _params_diff(a: dict, b: dict) -> str:
    keys = sorted(set(a) | set(b))
    return ", ".join(f"{k}: {a.get(k, '(unset)')!r} -> {b.get(k, '(unset)')!r}"
                     for k in keys if a.get(k) != b.get(k))


def survey(r: dict, folder: Path) -> dict:
    """What the unit folder holds for run ``r``: ``kept`` {document: record} (current), ``stale``
    {document: reason}, ``other`` (units of documents not in the run, left alone), ``removed`` (temporary
    files of interrupted writes, deleted).  Units of other parameters raise :class:`LongRunError`."""
    out = dict(kept={}, stale={}, other=[], removed=[])
    if not folder.is_dir():
        return out
    for tmp in sorted(folder.glob(".*.tmp")):  # an atomic write cut short (a killed driver): never a unit
        tmp.unlink(missing_ok=True)
        out["removed"].append(tmp.name)
    for f, doc, rec, why, other in _units_in(r, folder):
        if other:
            raise LongRunError(
                f"{folder} holds units computed with other parameters than run {r['name']!r} "
                f"({f.name}: {other}); pass --fresh to discard them (or remove the folder), or restore the "
                "run's parameters to resume it")
        if doc is None:
            out["other"].append(rec["document"] if rec else f.name)
        elif why:
            out["stale"][doc] = why
        else:
            out["kept"][doc] = rec
    return out


def _units_in(r: dict, folder: Path):
    """Each unit file of ``folder`` for run ``r``: (file, its document in the run or None, record or
    None, why it is stale or None, the parameters it differs in or None)."""
    want_code, want_params, want_settings = code_hash(modules(r)), params_hash(r), settings_sha(r)
    by_path = {unit_path(folder, d): d for d in r["documents"]}
    for f in sorted(folder.glob("*.unit.pkl")):
        rec, why = _read_unit(f)
        doc = by_path.get(f)
        if rec is not None and rec.get("params_hash") != want_params:
            yield f, doc, rec, None, _params_diff(rec.get("params", {}), params_of(r))
            continue
        if rec is not None and (rec.get("document"), rec.get("model")) != (doc, r["model"]):
            why = f"holds {rec.get('document')!r} on {rec.get('model')!r}"
        elif rec is not None and rec.get("code_hash") != want_code:
            why = f"code changed (computed with {rec['code_hash'][:10]}, now {want_code[:10]})"
        elif rec is not None and rec.get("settings_sha") != want_settings:
            why = "tuned settings changed"
        yield f, doc, rec, why, None


def progress(run: dict, folder: Path | None = None) -> dict:
    """How far the run's units are, without computing or deleting anything: ``done`` (units current
    for this code, parameters and settings), ``stale`` {document: reason}, ``total`` (the run's
    documents) and ``problem`` (units of other parameters, or None)."""
    r = longrun.check_run(run)
    folder = units_dir(r["name"]) if folder is None else folder
    out = dict(done=0, stale={}, total=len(r["documents"]), problem=None)
    if not folder.is_dir():
        return out
    for f, doc, _, why, other in _units_in(r, folder):
        if other:
            out["problem"] = f"{f.name} was computed with other parameters ({other})"
        elif doc is not None and why:
            out["stale"][doc] = why
        elif doc is not None:
            out["done"] += 1
    return out


def write_unit(folder: Path, rec: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = pickle.dumps(rec, protocol=pickle.HIGHEST_PROTOCOL)
    return atomic_write(unit_path(folder, rec["document"]), data)


def assemble(r: dict, units: dict) -> dict:
    """{table name: DataFrame} of the whole run from its units ({document: record}), as
    :func:`longrun.execute` over all documents returns them: rows in the run's document order."""
    recs = [units[d] for d in r["documents"]]
    names = list(recs[0]["tables"])
    tables = {}
    for t in names:
        if t == "settings":  # the same for every document (the tuned file and the run's budgets)
            first = recs[0]["tables"][t]
            if any(not rec["tables"][t].equals(first) for rec in recs[1:]):
                raise LongRunError(f"{r['name']}: units disagree on the settings table; rerun with --fresh")
            tables[t] = first
        else:
            tables[t] = pd.concat([rec["tables"][t] for rec in recs], ignore_index=True)
    return tables


# ------------------------------------------------------------------------------ running an entry

def _fmt(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _say(msg: str) -> None:
    print(msg, flush=True)


def run_entry(run: dict, *, config: str = "sweeps/qevict_long.yaml", jobs: int = 1, dask: str | None = None,
              fresh: bool = False, loader: str | None = None, verbose: bool = False, say=_say) -> Path:
    """Compute the run's missing and stale units, then write its artifact; returns its path.  ``say``
    receives every progress line (a test may interrupt from it)."""
    r = longrun.check_run(run)
    name, docs = r["name"], list(r["documents"])
    dup = sorted({d for d in docs if docs.count(d) > 1})
    if dup:
        raise LongRunError(f"run {name!r}: document(s) listed twice: {dup}; list each once")
    loader = loader if loader is not None else os.environ.get(LOADER_ENV) or None
    if loader and results_dir().resolve() == (REPO_ROOT / "results").resolve():
        raise LongRunError(f"a loader other than the real models ({loader!r}, {LOADER_ENV}) would write "
                           "its artifact into the repository's results/; set KVBOOK_RESULTS to another "
                           f"folder or unset {LOADER_ENV}")
    folder = units_dir(name)
    if fresh and folder.exists():
        shutil.rmtree(folder)
        say(f"[{name}] --fresh: removed {folder}")
    t0 = time.perf_counter()
    code = code_hash(modules(r))
    s = survey(r, folder)
    if s["removed"]:
        say(f"[{name}] removed {len(s['removed'])} half-written unit file(s) of an interrupted write: "
            + ", ".join(s["removed"]))
    if s["other"]:
        say(f"[{name}] {len(s['other'])} unit(s) of documents not in this run left as they are: "
            + ", ".join(s["other"]))
    todo = [d for d in docs if d not in s["kept"]]
    say(f"[{name}] {len(docs)} unit(s) ({r['model']}): {len(s['kept'])} kept (current code, parameters and "
        f"settings), {len(s['stale'])} stale, {len(todo) - len(s['stale'])} missing; {len(todo)} to compute"
        f"{' on Dask ' + dask if dask else f' in {jobs} process(es)' if jobs > 1 else ''}")
    for d, why in s["stale"].items():
        say(f"[{name}] recomputing stale unit {d}: {why}")
    units = dict(s["kept"])
    failed = {}
    if todo:
        precheck(r, loader)  # every document checked before the first unit starts
        tasks = [dict(run=r, document=d, loader=loader, verbose=verbose) for d in todo]
        done_now, par_dask = [], [1]

        def finished(doc, get):
            try:
                rec = get()
            except (KeyboardInterrupt, LongRunError):
                raise
            except Exception as e:  # the unit failed, or its worker died once too often (KilledWorker)
                failed[doc] = f"{type(e).__name__}: {e}"
                say(f"[{name}] unit {doc} FAILED: {failed[doc]}")
                return
            if rec["code_hash"] != code:
                raise LongRunError(f"{name} / {doc}: computed by code hashing {rec['code_hash'][:10]} on "
                                   f"{rec['host']}, not this checkout's {code[:10]}; run the workers from "
                                   "the same commit")
            write_unit(folder, rec)
            units[doc] = rec
            done_now.append(rec["seconds"])
            left = len(todo) - len(done_now) - len(failed)
            el = time.perf_counter() - t0
            par = max(1, jobs if not dask else par_dask[0])
            eta = f", about {_fmt(np.mean(done_now) * left / min(par, max(left, 1)))} to go" if left else ""
            say(f"[{name}] unit {doc} done in {_fmt(rec['seconds'])}: {len(units)}/{len(docs)} done, "
                f"{left} remaining; elapsed {_fmt(el)}{eta}")

        def workers(client):
            par_dask[0] = max(1, len(client.scheduler_info().get("workers", {})))

        run_tasks(compute_unit, tasks, lambda t, get: finished(t["document"], get), jobs=jobs, dask=dask,
                  on_client=workers)
    if failed:
        raise LongRunError(f"{name}: {len(failed)} unit(s) failed ({', '.join(failed)}); the {len(units)} "
                           f"finished are kept in {folder}: the same command computes only the others")
    if code_hash(modules(r)) != code:
        raise LongRunError(f"{name}: the code changed while it ran; run the same command again (units "
                           "computed with the old code are recomputed)")
    tables = assemble(r, units)
    cmd = f"{ENTRY} {config} --only {name}"
    cmd += f" --dask {dask}" if dask else f" --jobs {jobs}" if jobs > 1 else ""
    reused = sorted(s["kept"])
    extra = dict(units=dict(folder=folder.name, computed=[d for d in docs if d not in s["kept"]],
                            reused=reused, unit_seconds=round(sum(u["seconds"] for u in units.values()), 1)))
    if loader:
        extra["loader"] = loader
    path = write_artifact(name, tables, modules=modules(r), command=cmd,
                          wall_seconds=time.perf_counter() - t0, params=run, notes=run.get("notes", ""),
                          extra=extra)
    say(f"[{name}] wrote {path} ({_fmt(time.perf_counter() - t0)}; {len(reused)} of {len(docs)} units from "
        f"an earlier invocation; units computed in {_fmt(extra['units']['unit_seconds'])} in all)")
    return path


def load_runs(config: str, only=None) -> list[dict]:
    try:
        with open(config) as fh:
            runs = yaml.safe_load(fh)["runs"]
    except (OSError, KeyError, TypeError, yaml.YAMLError) as e:
        raise LongRunError(f"cannot read the runs of {config} ({type(e).__name__}: {e}); give a YAML file "
                           "with a list 'runs' (e.g. sweeps/qevict_long.yaml)") from e
    names = [r.get("name") for r in runs]
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise LongRunError(f"unknown run(s) {unknown} in {config}; runs: {names}")
        runs = [r for r in runs if r["name"] in only]
    for r in runs:
        longrun.check_run(r)  # all runs checked before the first starts
    return runs


def regenerating(config: str | Path = "sweeps/qevict_long.yaml") -> dict:
    """The sweep's declared regeneration in progress: dict(since, reason, runs), or ``runs`` empty when
    none is declared.  A committed artifact of a run named there may be stale while its units are being
    computed, here or on later machines, from the units committed in ``results/<name>.units/``
    (``tests/test_artifacts.py`` allows nothing else to be stale); the chapter says how far each is."""
    path = Path(config)
    if not path.is_absolute():
        path = REPO_ROOT / path
    with open(path) as fh:
        doc = yaml.safe_load(fh)
    reg = doc.get("regenerating") or {}
    names = [r.get("name") for r in doc["runs"]]
    runs = list(reg.get("runs", []))
    unknown = sorted(set(runs) - set(names))
    if unknown:
        raise LongRunError(f"{config}: regenerating names run(s) {unknown} that the sweep does not declare; "
                           f"runs: {names}")
    if runs and not (reg.get("since") and reg.get("reason")):
        raise LongRunError(f"{config}: a declared regeneration needs 'since' (a date) and 'reason'")
    return dict(since=str(reg.get("since", "")), reason=reg.get("reason", ""), runs=runs)


def regeneration_status(config: str | Path = "sweeps/qevict_long.yaml") -> dict:
    """{run name: :func:`progress`} of every run the sweep declares as regenerating."""
    reg = regenerating(config)
    path = Path(config) if Path(config).is_absolute() else REPO_ROOT / config
    with open(path) as fh:
        runs = {r["name"]: r for r in yaml.safe_load(fh)["runs"]}
    return {n: progress(runs[n]) for n in reg["runs"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=ENTRY, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", help="YAML with a list 'runs' (e.g. sweeps/qevict_long.yaml)")
    ap.add_argument("--only", nargs="*", help="names of the runs to execute (default: all)")
    ap.add_argument("--jobs", type=int, default=1, help="units computed at once in local processes, "
                    "one thread each (default 1)")
    ap.add_argument("--dask", metavar="ADDRESS", help="compute the units on a Dask cluster, e.g. "
                    "tcp://HOST:8786 (workers started with --nthreads 1)")
    ap.add_argument("--fresh", action="store_true",
                    help="discard the runs' stored units and compute all anew")
    ap.add_argument("--verbose", action="store_true", help="print each unit's own progress (longrun's lines)")
    a = ap.parse_args(argv)
    if a.jobs < 1:
        print("--jobs must be >= 1", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    name = None
    try:
        runs = load_runs(a.config, a.only)
        for i, r in enumerate(runs, 1):
            name = r["name"]
            _say(f"== run {i}/{len(runs)}: {name}; elapsed {_fmt(time.perf_counter() - t0)}")
            run_entry(r, config=a.config, jobs=a.jobs, dask=a.dask, fresh=a.fresh, verbose=a.verbose)
    except LongRunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        where = f" in {units_dir(name)}" if name else ""
        print(f"\ninterrupted: every finished unit is kept{where}; the same command resumes "
              "(it computes only the missing units)", file=sys.stderr)
        return 130
    _say(f"== {len(runs)} run(s) written in {_fmt(time.perf_counter() - t0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
