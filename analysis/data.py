"""Resolve the book's data files, with provenance and checksums.

Two kinds of data:

* **In-repo tables** under ``data/`` (CSV): small, curated inputs (model configs, hardware, prices).
  Every row carries ``source`` and ``date`` columns (and ``estimate`` where a value is not a
  published figure). :func:`table` loads one and refuses a table whose provenance is missing.
* **External files** listed in ``data/registry.yaml`` (name, sha256, canonical URL, licence, mirror
  subpath). :func:`path` resolves one in this order and verifies its sha256 every time:

  1. ``$KVBOOK_DATA/<mirror>`` (a folder you point at),
  2. ``data/external/<mirror>`` (the download cache of this checkout),
  3. ``../shared/data/<mirror>`` (a local mirror next to the checkout),
  4. download from the canonical URL with pooch into ``data/external/`` (only if
     ``KVBOOK_OFFLINE`` is not set), verified by the same checksum.
"""
from __future__ import annotations

import argparse
import csv
import functools
import hashlib
import io
import os
import sys
from pathlib import Path

import pandas as pd
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT / "data"
REGISTRY_FILE = DATA_DIR / "registry.yaml"
EXTERNAL_DIR = DATA_DIR / "external"
SHARED_MIRROR = REPO_ROOT.parent / "shared" / "data"

PROVENANCE_COLUMNS = ("source", "date")


class DataError(RuntimeError):
    """A data file is missing, corrupt or lacks provenance. The message says what to do."""


def _trace_read(rel: str) -> None:
    """Append ``rel`` (a repo-relative file) to ``$KVBOOK_TRACE_READS`` when set: the record of
    what a chapter really reads, which tests compare with :mod:`analysis.deps`' static list."""
    log = os.environ.get("KVBOOK_TRACE_READS")
    if log:
        with open(log, "a") as fh:
            fh.write(rel + "\n")


def registry() -> dict:
    """The parsed ``data/registry.yaml`` (name -> entry)."""
    _trace_read("data/registry.yaml")
    return _registry()


@functools.lru_cache(maxsize=None)
def _registry() -> dict:
    if not REGISTRY_FILE.exists():
        raise DataError(f"{REGISTRY_FILE} is missing: this checkout is incomplete (git checkout -- data/).")
    with open(REGISTRY_FILE) as fh:
        reg = yaml.safe_load(fh)
    files = reg.get("files") or {}
    for name, entry in files.items():
        missing = {"mirror", "sha256", "url", "licence", "source"} - set(entry)
        if missing:
            raise DataError(f"registry entry {name!r} lacks {sorted(missing)} in {REGISTRY_FILE}")
        if not entry["sha256"] and not entry.get("git_blob_sha1"):
            raise DataError(f"registry entry {name!r} needs a checksum: sha256, or git_blob_sha1 where only "
                            f"the git blob id of the file is known ({REGISTRY_FILE})")
    return files


@functools.lru_cache(maxsize=64)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256(path: str | os.PathLike) -> str:
    """sha256 of a file (memoised on path, size and mtime, so it is re-hashed when it changes)."""
    st = os.stat(path)
    return _sha256_cached(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _git_blob_cached(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git_blob_sha1(path: str | os.PathLike) -> str:
    """Git's blob id of a file (sha1 of ``"blob <size>\\0"`` + content): pins a file of a repository
    snapshot whose listing gives the blob id but not the content."""
    st = os.stat(path)
    return _git_blob_cached(str(path), st.st_size, st.st_mtime_ns)


def checksum(entry: dict, path: str | os.PathLike) -> tuple[str, str, str]:
    """(kind, got, want) of the checksum a registry entry declares: sha256, else the git blob id."""
    if entry.get("sha256"):
        return "sha256", sha256(path), entry["sha256"]
    return "git blob sha1", git_blob_sha1(path), entry["git_blob_sha1"]


def checksum_text(entry: dict) -> str:
    if entry.get("sha256"):
        return f"sha256 must be {entry['sha256']}"
    return f"its git blob sha1 must be {entry['git_blob_sha1']}"


def candidates(mirror: str) -> list[Path]:
    """The places :func:`path` looks for a registered file, in order."""
    out = []
    env = os.environ.get("KVBOOK_DATA")
    if env:
        out.append(Path(env) / mirror)
    out.append(EXTERNAL_DIR / mirror)
    out.append(SHARED_MIRROR / mirror)
    return out


def path(name: str, *, download: bool | None = None) -> Path:
    """Local path of the registered external file ``name``, verified against its sha256.

    Raises :class:`DataError` naming the places searched, the URL and how to fix it.
    """
    reg = registry()
    if name not in reg:
        raise DataError(f"unknown data file {name!r}; registered files: {sorted(reg)} (data/registry.yaml)")
    entry = reg[name]
    mirror = entry["mirror"]
    for cand in candidates(mirror):
        if cand.is_file():
            kind, got, want = checksum(entry, cand)
            if got != want:
                raise DataError(
                    f"{cand} is corrupt or a different version: {kind} {got}, registry says {want}. "
                    f"Delete it and fetch the original from {entry['url']}"
                )
            return cand
    if download is None:
        download = not os.environ.get("KVBOOK_OFFLINE")
    if download:
        try:
            import pooch  # optional heavy dependency

            EXTERNAL_DIR.joinpath(mirror).parent.mkdir(parents=True, exist_ok=True)
            fetched = pooch.retrieve(
                entry["url"], known_hash=f"sha256:{entry['sha256']}" if entry["sha256"] else None,
                fname=Path(mirror).name, path=EXTERNAL_DIR / Path(mirror).parent, progressbar=False,
            )
            kind, got, want = checksum(entry, fetched)
            if got != want:
                os.remove(fetched)
                raise DataError(f"downloaded file has {kind} {got}, registry says {want}")
            return Path(fetched)
        except Exception as exc:  # network down, wrong hash: both end in the same advice
            reason = f" (download failed: {exc})"
    else:
        reason = " (downloads disabled by KVBOOK_OFFLINE)"
    searched = ", ".join(str(c) for c in candidates(mirror))
    raise DataError(
        f"data file {name!r} not found{reason}. Looked in: {searched}. Obtain it from {entry['url']} "
        f"(licence {entry['licence']}), save it as data/external/{mirror} or point KVBOOK_DATA at a "
        f"folder holding {mirror}; {checksum_text(entry)}."
    )


def content_id(source) -> str:
    """sha256 of the content behind ``source``: a registered name (its verified checksum) or a file
    path (absolute, or relative to the working directory or the repository). Key result caches of a
    user-supplied file on this, never on its name: a different file under the same name must not
    reuse another's result."""
    s = str(source)
    if s in registry():
        return registry()[s]["sha256"]
    p = Path(s).expanduser()
    if not p.is_file() and not p.is_absolute() and (REPO_ROOT / p).is_file():
        p = REPO_ROOT / p
    if not p.is_file():
        raise DataError(f"{s!r} is neither a registered name ({', '.join(sorted(registry()))}) nor a file")
    return sha256(p)


def describe(name: str) -> dict:
    """Registry entry of ``name`` plus where it resolved (for the appendix)."""
    entry = dict(registry()[name])
    entry["name"] = name
    entry["resolved"] = str(path(name))
    return entry


@functools.lru_cache(maxsize=None)
def _read_table(file: str, mtime_ns: int) -> pd.DataFrame:
    """Parse a table. Only lines *starting* with ``#`` are comments (a ``#`` inside a field, as in
    "PR #28068", is data); blank lines are skipped. ``attrs["lines"]`` holds each row's line number
    in the file (comment lines counted), ``attrs["file"]`` the repo-relative path: see :func:`where`."""
    kept, quoted = [], False  # quoted: inside a quoted field that spans lines (kept verbatim)
    for n, ln in enumerate(Path(file).read_text(encoding="utf-8").splitlines(keepends=True), 1):
        if quoted or not (ln.startswith("#") or not ln.strip()):
            kept.append((n, ln))
            quoted ^= ln.count('"') % 2 == 1
    text = "".join(ln for _, ln in kept)
    # the file line of each record's first line (quoted fields may span lines)
    starts, reader = [], csv.reader(io.StringIO(text), skipinitialspace=True)
    consumed = 0
    for _ in reader:
        starts.append(kept[consumed][0])
        consumed = reader.line_num
    df = pd.read_csv(io.StringIO(text), skipinitialspace=True, skip_blank_lines=False)
    lines = starts[1:]  # the first record is the header
    if len(lines) != len(df):  # cannot happen for a well-formed CSV; keep errors pointing somewhere
        lines = [None] * len(df)
    df.attrs["lines"] = lines
    try:
        df.attrs["file"] = Path(file).resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        df.attrs["file"] = str(file)
    return df


def where(df: pd.DataFrame, index) -> str:
    """``"data/models.csv:17"``: the file and line (comment lines counted) of row ``index`` of a
    table returned by :func:`table`, for error messages."""
    lines = df.attrs.get("lines")
    file = df.attrs.get("file", "?")
    try:
        pos = df.index.get_loc(index)
        line = lines[pos] if lines else None
    except (KeyError, IndexError, TypeError):
        line = None
    return f"{file}:{line}" if line is not None else f"{file} (row {index})"


def table(name: str, *, provenance: bool = True) -> pd.DataFrame:
    """Load the in-repo table ``data/<name>`` (a copy; callers may modify it).

    With ``provenance=True`` every row must have a non-empty ``source`` and ``date``.
    """
    file = DATA_DIR / name
    _trace_read(f"data/{name}")
    if not file.is_file():
        raise DataError(f"data table {file} is missing: restore it with `git checkout -- data/{name}`.")
    try:
        cached = _read_table(str(file), file.stat().st_mtime_ns)
        df = cached.copy()
        df.attrs = {"lines": list(cached.attrs["lines"]), "file": cached.attrs["file"]}
    except Exception as exc:
        raise DataError(f"data table {file} cannot be parsed as CSV ({exc}); restore it from git.") from exc
    if provenance:
        missing_cols = [c for c in PROVENANCE_COLUMNS if c not in df.columns]
        if missing_cols:
            raise DataError(f"{file} lacks provenance columns {missing_cols}")
        for col in PROVENANCE_COLUMNS:
            bad = df[col].isna() | (df[col].astype(str).str.strip() == "")
            if bad.any():
                rows = [where(df, i).rsplit(":", 1)[-1] for i in df.index[bad]]
                raise DataError(f"{file}: rows on lines {', '.join(rows[:10])} have no {col!r}; "
                                "every value needs one")
    return df


@functools.lru_cache(maxsize=4)
def _published_rows(file: str, mtime_ns: int) -> dict:
    """key -> row of ``data/published.csv`` at one version of the file, validated once by
    :func:`table` (a claim's verdict looks up its references at every sensitivity end: re-validating
    the table each time cost about 0.1 s per lookup)."""
    df = table("published.csv")
    rows: dict = {}
    for rec in df.to_dict("records"):
        rows.setdefault(rec["key"], rec)  # the first row of a key, as before
    return rows


def published(key: str) -> dict:
    """A published figure from ``data/published.csv`` (the claims' own numbers), as a dict with
    ``value`` (float, in ``unit``), ``unit``, ``claim``, ``source`` and ``date``."""
    file = DATA_DIR / "published.csv"
    _trace_read("data/published.csv")
    if not file.is_file():
        table("published.csv")  # raises the message that says how to restore it
    rows = _published_rows(str(file), file.stat().st_mtime_ns)
    if key not in rows:
        raise DataError(f"no published figure {key!r} in data/published.csv; keys: {', '.join(rows)}")
    row = dict(rows[key])
    row["value"] = float(row["value"])
    return row


def fetch_all(*, download: bool | None = None, out=None) -> dict[str, Path | DataError]:
    """Resolve (and, unless ``KVBOOK_OFFLINE`` is set, download) every registered file, verifying
    its sha256; prints where each landed or why it is missing. Returns name -> path or error."""
    out = out or sys.stdout
    results: dict[str, Path | DataError] = {}
    reg = registry()
    for name in sorted(reg):
        try:
            p = path(name, download=download)
            results[name] = p
            print(f"ok       {name}: {p} (sha256 verified)", file=out)
        except DataError as exc:
            results[name] = exc
            print(f"MISSING  {name}: {exc}", file=out)
    bad = [n for n, r in results.items() if isinstance(r, DataError)]
    print(f"{len(reg) - len(bad)} of {len(reg)} registered files present and verified"
          + (f"; missing: {', '.join(bad)}" if bad else ""), file=out)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.data",
                                 description="Fetch and verify the external files of data/registry.yaml.")
    ap.add_argument("--fetch-all", action="store_true",
                    help="resolve every registered file (download it unless KVBOOK_OFFLINE is set), verify "
                         "its sha256 and say where it is (what `make data` runs)")
    ap.add_argument("--offline", action="store_true",
                    help="only check what is already here; download nothing")
    a = ap.parse_args(argv)
    if not a.fetch_all:
        ap.print_help()
        return 2
    try:
        results = fetch_all(download=False if a.offline else None)
    except DataError as exc:
        print(f"error: {exc}")
        return 2
    return 1 if any(isinstance(r, DataError) for r in results.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
