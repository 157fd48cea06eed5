"""Committed results of runs too long for the book build, with provenance and stale detection.

An artifact is a folder ``results/<name>/`` holding tidy CSV tables and ``provenance.json``:
the commit it was computed at (and whether the tree had uncommitted changes), a hash of the source
of the modules it depends on, the date (UTC), the machine (CPU, cores, memory, load average), the
command that reproduces it, the wall time, its parameters and the sha256 of every table.

A chapter reads an artifact with :func:`read_artifact`; it is **stale** when the current source of
any module it depends on hashes differently from what it was computed with, or when a table no
longer matches its recorded sha256 (edited by hand).  The chapter shows the flag;
``tests/test_artifacts.py`` fails on a stale artifact.  Writing is atomic: the folder is built as
``results/<name>.partial-XXXX`` and replaces the old one only when complete (the old one is renamed
aside to ``<name>.old-XXXX`` first and removed after: an interruption never leaves a mix of the two,
nor a half-written table at ``results/<name>/``). :func:`atomic_write` writes one file the same way
(a complete temporary file in the same folder, then a rename); the sweeps' ``results.csv`` and the
build's keys use it.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .data import _trace_read

REPO_ROOT = Path(__file__).resolve().parent.parent


def results_dir() -> Path:
    return Path(os.environ.get("KVBOOK_RESULTS", REPO_ROOT / "results"))


def trace_read(path: Path) -> None:
    """Record the read of an in-repo file for the check that chapters' cache keys cover what they
    read (``KVBOOK_TRACE_READS``, :mod:`analysis.data`, :mod:`analysis.deps`)."""
    try:
        rel = Path(path).resolve().relative_to(REPO_ROOT.resolve()).as_posix()
    except ValueError:
        return  # outside the repository (KVBOOK_RESULTS elsewhere): not part of any key
    _trace_read(rel)


def _module_files(module: str) -> list[Path]:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"module {module!r} not found")
    if spec.submodule_search_locations:  # a package: every .py below it
        return sorted(p for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.py"))
    return [Path(spec.origin)]


def code_hash(modules) -> str:
    """sha256 over the names and source bytes of ``modules`` (dotted names; a package means all
    its files), independent of the order they are given in."""
    h = hashlib.sha256()
    for m in sorted(set(modules)):
        for f in _module_files(m):
            h.update(m.encode() + b"\0" + f.name.encode() + b"\0")
            h.update(f.read_bytes())
    return h.hexdigest()


def _safe_files(module: str) -> list:
    try:
        return _module_files(module)
    except ModuleNotFoundError:
        return []


def _git(*args) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return dict(cpu=cpu, cores=os.cpu_count(), memory_bytes=mem, system=platform.system(),
                python=platform.python_version(), loadavg=list(load) if load else None)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()
_FILE_MODE, _DIR_MODE = 0o666 & ~_UMASK, 0o777 & ~_UMASK  # what open() and mkdir() give (mkstemp: 0600)


def atomic_write(path, data=None, *, write=None) -> Path:
    """Write ``path`` whole or not at all: ``data`` (str or bytes), or ``write(tmp_path)`` for a writer
    that takes a path (``df.to_csv``), goes to a temporary file beside ``path`` that replaces it by a
    rename only once complete. An exception (or Ctrl-C) mid-write leaves the old ``path`` as it was and
    no temporary file behind."""
    path = Path(path)
    if (data is None) == (write is None):
        raise TypeError("atomic_write(path, data) or atomic_write(path, write=fn)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else _FILE_MODE)
        if write is None:
            with os.fdopen(fd, "wb" if isinstance(data, (bytes, bytearray)) else "w") as fh:
                fh.write(data)
        else:
            os.close(fd)
            write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def replace_dir(src: Path, dst: Path) -> None:
    """Put the complete folder ``src`` at ``dst``: an existing ``dst`` is renamed aside first
    (``<dst>.old-XXXX``) and removed after, so ``dst`` never holds a mix of the two."""
    old = None
    if dst.exists():
        old = dst.with_name(f"{dst.name}.old-{uuid.uuid4().hex[:8]}")
        dst.rename(old)
    try:
        os.replace(src, dst)
    except BaseException:  # interrupted between the two renames: the old folder goes back
        if old is not None and not dst.exists():
            old.rename(dst)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _sha_file(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def write_artifact(name: str, tables: dict, *, modules, command: str, wall_seconds: float, params=None,
                   notes: str = "", extra: dict | None = None) -> Path:
    """Write ``tables`` ({table name: DataFrame}) and their provenance to ``results/<name>/``."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"bad artifact name {name!r}")
    if not tables:
        raise ValueError("an artifact needs at least one table")
    root = results_dir()
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    shutil.rmtree(root / f"{name}.partial", ignore_errors=True)  # left by an older, interrupted write
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}.partial-", dir=root))  # never shared by two writers
    tmp.chmod(_DIR_MODE)
    try:
        shas = {}
        for t, df in tables.items():
            p = tmp / f"{t}.csv"
            df.to_csv(p, index=False)
            shas[t] = _sha_file(p)
        prov = dict(
            name=name, commit=_git("rev-parse", "HEAD"),
            dirty=bool(_git("status", "--porcelain", "--", "analysis")),
            dirty_files=sorted(set(_git("diff", "--name-only", "HEAD", "--", "analysis").splitlines()
                                   + _git("ls-files", "--others", "--exclude-standard", "--",
                                          "analysis").splitlines())),
            modules=sorted(set(modules)), code_hash=code_hash(modules),
            date=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
            machine=machine_info(), command=command, wall_seconds=round(float(wall_seconds), 1),
            params=params or {}, tables=shas, notes=notes, **(extra or {}))
        (tmp / "provenance.json").write_text(json.dumps(prov, indent=1, default=str) + "\n")
        replace_dir(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return final


@dataclass
class Artifact:
    name: str
    tables: dict
    provenance: dict
    stale_reasons: list

    @property
    def stale(self) -> bool:
        return bool(self.stale_reasons)

    def _dirty_text(self) -> str:
        """Whether ``analysis/`` had uncommitted changes when it was written, and whether they touched
        its code: the files the provenance lists (older provenance lists none), or, when its code hash
        still matches, none of them did."""
        p = self.provenance
        if not p.get("dirty"):
            return ""
        files = p.get("dirty_files") or []
        code = {x.resolve() for m in p.get("modules", []) for x in _safe_files(m)}
        mine = [f for f in files if (REPO_ROOT / f).resolve() in code]
        if files:
            return (f" (uncommitted changes in {', '.join(files)}"
                    f"{'' if mine else '; none in its code'})")
        return " (uncommitted changes; none in its code)" if not self.stale else " (uncommitted changes)"

    def describe(self) -> str:
        """One line for a chapter: where the numbers come from, when, and whether they are stale."""
        p = self.provenance
        m = p.get("machine", {})
        load = m.get("loadavg")
        s = (f"results/{self.name}, computed {p.get('date', '?')} at commit {str(p.get('commit', '?'))[:10]}"
             f"{self._dirty_text()} on {m.get('cores', '?')} cores of "
             f"{m.get('cpu', '?')}"
             f"{f' (load {load[0]:.1f})' if load else ''} in {p.get('wall_seconds', 0) / 60:.1f} min"
             f"{_resumed(p.get('units') or {})}; reproduce with `{p.get('command', '?')}`")
        if self.stale:
            s = "**STALE** (" + "; ".join(self.stale_reasons) + "): " + s
        return s


def _resumed(units: dict) -> str:
    """For a long run resumed from units computed earlier (:mod:`analysis.qevict.longrun_units`): how
    many, and the compute time of all its units (the wall time is the last invocation's)."""
    if not units.get("reused"):
        return ""
    n = len(units["reused"]) + len(units.get("computed", []))
    return (f" ({len(units['reused'])} of {n} units computed by an earlier invocation; "
            f"{units.get('unit_seconds', 0) / 60:.1f} min of unit compute in all)")


def stale_reasons(name: str, prov: dict) -> list:
    out = []
    try:
        now = code_hash(prov.get("modules", []))
    except ModuleNotFoundError as e:
        now = None
        out.append(str(e))
    if now is not None and now != prov.get("code_hash"):
        out.append("the code it depends on has changed since (" + ", ".join(prov.get("modules", [])) + ")")
    for t, sha in prov.get("tables", {}).items():
        p = results_dir() / name / f"{t}.csv"
        if not p.is_file():
            out.append(f"table {t}.csv missing")
        elif _sha_file(p) != sha:
            out.append(f"table {t}.csv edited after it was computed")
    return out


def read_artifact(name: str) -> Artifact:
    d = results_dir() / name
    pj = d / "provenance.json"
    if not pj.is_file():
        have = sorted(p.name for p in results_dir().glob("*") if (p / "provenance.json").is_file())
        have_s = ", ".join(have) or "none"
        raise FileNotFoundError(f"no artifact {name!r} in {results_dir()} (have: {have_s}); "
                                f"`make long` computes the long-run artifacts")
    prov = json.loads(pj.read_text())
    trace_read(pj)
    tables = {}
    for t in prov.get("tables", {}):
        if (d / f"{t}.csv").is_file():
            tables[t] = pd.read_csv(d / f"{t}.csv")
            trace_read(d / f"{t}.csv")
    return Artifact(name, tables, prov, stale_reasons(name, prov))


def usable(name: str, key: dict, tables=(), *, command: str, title: str | None = None,
           labels: dict | None = None) -> tuple[Artifact | None, str]:
    """The artifact ``name`` if it stands for a computation with inputs ``key`` (compared with the
    ``params`` it was written with, entry by entry), is not stale and has every table of ``tables``;
    else ``None`` and why not, naming ``command`` (what rewrites it).  ``title``: what the reasons call
    the artifact (default ``results/<name>``); ``labels``: {key entry: how a difference in it reads}
    (default ``other <entry>``)."""
    what = f"the committed {title}" if title else f"results/{name}"
    try:
        art = read_artifact(name)
    except FileNotFoundError:
        return None, f"no committed {title or name} (`{command}` writes it)"
    if art.stale:
        why = "; ".join(art.stale_reasons)
        return None, f"{what} is stale ({why}; `{command}` refreshes it)"
    have = art.provenance.get("params") or {}
    diff = [k for k in key if key[k] != have.get(k)]
    if diff:
        labels = labels or {}
        return None, f"{what} was computed with " + ", ".join(labels.get(k, f"other {k}") for k in diff)
    missing = [t for t in tables if t not in art.tables]
    if missing:
        return None, f"{what} lacks tables {missing} (`{command}` rewrites it)"
    return art, ""


def list_artifacts() -> list:
    return sorted(p.parent.name for p in results_dir().glob("*/provenance.json"))
