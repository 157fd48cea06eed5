"""Build the book: ``python -m analysis.build`` (what ``make book`` runs).

jupyter-cache re-executes a chapter only when its cells change. A chapter's output also depends on
the ``analysis`` package and the ``data/`` tables, so the cache is keyed on their hash
(:func:`analysis.cache.package_hash`), together with the committed long-run artifacts under
``results/`` (which chapters read): when it changes, the execution cache is cleared and every
chapter runs again. The build treats warnings (and unresolved references, nitpicky) as errors.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .cache import package_hash

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD = REPO_ROOT / "_build"
JCACHE = BUILD / ".jupyter_cache"
STAMP = BUILD / ".analysis-hash"


def invalidate_if_changed() -> bool:
    """Clear the jupyter-cache when the package, data or results/ artifacts changed since the last build."""
    import hashlib

    hr = hashlib.sha256(package_hash().encode())
    for f in sorted((REPO_ROOT / "results").rglob("*")):
        if f.is_file():
            hr.update(str(f.relative_to(REPO_ROOT)).encode() + b"\0" + f.read_bytes())
    h = hr.hexdigest()
    old = STAMP.read_text().strip() if STAMP.exists() else None
    if old != h:
        if JCACHE.exists():
            shutil.rmtree(JCACHE)
        BUILD.mkdir(exist_ok=True)
        STAMP.write_text(h + "\n")
        return True
    return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.build", description=__doc__.split("\n\n")[0])
    ap.add_argument("--builder", default="html", help="html (default) or linkcheck")
    ap.add_argument("--no-strict", action="store_true", help="do not treat warnings as errors")
    a = ap.parse_args(argv)
    changed = invalidate_if_changed()
    state = "changed: chapters will be re-executed" if changed else "unchanged: cached chapters reused"
    print(f"analysis/, data/ and results/ {state}")
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(exe), "build", str(REPO_ROOT), "--builder", a.builder]
    if not a.no_strict:
        cmd += ["-W", "-n", "--keep-going"]
    cmd += ["--all"]  # re-read every page so that no warning is hidden by an incremental build
    env = dict(os.environ)
    env.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    t0 = time.perf_counter()
    rc = subprocess.call(cmd, cwd=REPO_ROOT, env=env)
    print(f"jupyter-book {a.builder} build finished in {time.perf_counter() - t0:.0f} s with exit code {rc}")
    if rc == 0 and a.builder == "html":
        print(f"open {BUILD / 'html' / 'index.html'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
