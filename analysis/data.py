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

import functools
import hashlib
import os
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


@functools.lru_cache(maxsize=None)
def registry() -> dict:
    """The parsed ``data/registry.yaml`` (name -> entry)."""
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
            import pooch

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


def describe(name: str) -> dict:
    """Registry entry of ``name`` plus where it resolved (for the appendix)."""
    entry = dict(registry()[name])
    entry["name"] = name
    entry["resolved"] = str(path(name))
    return entry


@functools.lru_cache(maxsize=None)
def _read_table(file: str, mtime_ns: int) -> pd.DataFrame:
    return pd.read_csv(file, comment="#", skipinitialspace=True)


def table(name: str, *, provenance: bool = True) -> pd.DataFrame:
    """Load the in-repo table ``data/<name>`` (a copy; callers may modify it).

    With ``provenance=True`` every row must have a non-empty ``source`` and ``date``.
    """
    file = DATA_DIR / name
    if not file.is_file():
        raise DataError(f"data table {file} is missing: restore it with `git checkout -- data/{name}`.")
    try:
        df = _read_table(str(file), file.stat().st_mtime_ns).copy()
    except Exception as exc:
        raise DataError(f"data table {file} cannot be parsed as CSV ({exc}); restore it from git.") from exc
    if provenance:
        missing_cols = [c for c in PROVENANCE_COLUMNS if c not in df.columns]
        if missing_cols:
            raise DataError(f"{file} lacks provenance columns {missing_cols}")
        for col in PROVENANCE_COLUMNS:
            bad = df[col].isna() | (df[col].astype(str).str.strip() == "")
            if bad.any():
                rows = (df.index[bad] + 2).tolist()  # +2: header line and 1-based lines
                raise DataError(f"{file}: rows on lines {rows[:10]} have no {col!r}; every value needs one")
    return df


def published(key: str) -> dict:
    """A published figure from ``data/published.csv`` (the claims' own numbers), as a dict with
    ``value`` (float, in ``unit``), ``unit``, ``claim``, ``source`` and ``date``."""
    df = table("published.csv")
    hit = df[df["key"] == key]
    if hit.empty:
        raise DataError(f"no published figure {key!r} in data/published.csv; keys: {', '.join(df['key'])}")
    row = hit.iloc[0].to_dict()
    row["value"] = float(row["value"])
    return row
