"""Time and peak memory of every chapter, as a reader rerunning it meets them (not run as a test).

    .venv/bin/python benchmarks/chapter_resources.py                 # every chapter of _toc.yml
    .venv/bin/python benchmarks/chapter_resources.py 01_kv_footprint  # some chapters

Each chapter runs through papermill (``analysis.rerun.execute``) with its default parameters, twice:
``cold``, with an empty result cache (``KVBOOK_CACHE`` set to a new folder: everything is computed),
then ``warm``, with the cache the cold run filled (what a rebuild costs). For each run it records
the wall time and the peak resident memory of the kernel: the kernel's own high-water mark
(``VmHWM`` from /proc, read every 0.1 s while it runs, so exact up to the last 0.1 s) and the
largest sum of RSS over the kernel and its children at any sample (for chapters that start
processes), and the machine's load average (other work running at the same time slows a chapter
down). The table, with the machine (CPU model, cores, memory), the date and the commit, is
written to ``data/chapter_resources.csv``; the appendix "Reproduce this book" reads it.

Chapters not named keep their previous rows. Run it on the 2-core build machine, with nothing else
running, after a chapter changed.
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
OUT = REPO / "data" / "chapter_resources.csv"
SOURCE = "measured by benchmarks/chapter_resources.py (papermill, default parameters)"


def toc_chapters() -> list[str]:
    import yaml

    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    found = []

    def walk(items):
        for it in items or []:
            f = str(it.get("file", ""))
            m = re.match(r"^book/(\d\d_[^/.]+)", f)
            if m:
                found.append(m.group(1))
            walk(it.get("sections"))
            walk(it.get("chapters"))

    for p in toc.get("parts", []) or []:
        walk(p.get("chapters"))
    walk(toc.get("chapters"))
    return found


def machine() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        m = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        mem = int(m.group(1)) * 1024 if m else 0
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "analysis", "book", "data"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        commit += "+changes" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"cpu_model": cpu, "n_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "mem_total_bytes": mem, "python": platform.python_version(),
            "os": f"{platform.system()} {platform.release()}", "commit": commit}


def _status_kb(pid: int, field: str) -> int:
    try:
        m = re.search(rf"^{field}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
        return int(m.group(1)) * 1024 if m else 0
    except OSError:
        return 0


class PeakMemory:
    """Samples this process's descendants (the kernel and whatever it starts) every ``interval`` s."""

    def __init__(self, interval: float = 0.1):
        import psutil

        self.me = psutil.Process()
        self.interval = interval
        self.hwm: dict[int, int] = {}
        self.tree_peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                kids = self.me.children(recursive=True)
            except Exception:
                kids = []
            total = 0
            for k in kids:
                self.hwm[k.pid] = max(self.hwm.get(k.pid, 0), _status_kb(k.pid, "VmHWM"))
                total += _status_kb(k.pid, "VmRSS")
            self.tree_peak = max(self.tree_peak, total)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    @property
    def kernel_peak(self) -> int:
        return max(self.hwm.values(), default=0)


def measure(chapter: str, cache_dir: Path, out_dir: Path) -> dict:
    from analysis import rerun

    os.environ["KVBOOK_CACHE"] = str(cache_dir)  # the kernel inherits it
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with PeakMemory() as pm:
        row = rerun.execute(f"book/{chapter}.md", {}, out_dir)
    secs = time.perf_counter() - t0
    return {"seconds": round(secs, 1), "load_avg_1min": round(max(load_before, os.getloadavg()[0]), 2),
            "kernel_peak_rss_bytes": pm.kernel_peak,
            "tree_peak_rss_bytes": pm.tree_peak, "status": row["status"],
            "error": (row.get("error") or "")[:200]}


def main(argv=None) -> int:
    import pandas as pd

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("chapters", nargs="*", help="chapter stems (default: every chapter of _toc.yml)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--commit", help="the commit measured (default: git rev-parse HEAD of this checkout)")
    a = ap.parse_args(argv)
    chapters = a.chapters or toc_chapters()
    mach = machine()
    if a.commit:
        mach["commit"] = a.commit
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvbook-bench-") as tmp:
        for ch in chapters:
            cache = Path(tmp) / f"cache-{ch}"
            cache.mkdir()
            for kind in ("cold", "warm"):
                print(f"{ch} ({kind} result cache) ...", flush=True)
                r = measure(ch, cache, Path(tmp) / f"runs-{ch}-{kind}")
                print(f"  {r['status']}: {r['seconds']:.1f} s, kernel peak RSS "
                      f"{r['kernel_peak_rss_bytes'] / 1e6:,.0f} MB"
                      f" (process tree {r['tree_peak_rss_bytes'] / 1e6:,.0f} MB) {r['error']}", flush=True)
                rows.append({"chapter": ch, "cache": kind, **r, **mach, "date": today, "source": SOURCE})
    new = pd.DataFrame(rows)
    if a.out.is_file():
        old = pd.read_csv(a.out, comment="#")
        new = pd.concat([old[~old["chapter"].isin(chapters)], new], ignore_index=True)
    new = new.sort_values(["chapter", "cache"]).reset_index(drop=True)
    header = ("# Time and peak memory of each chapter run through papermill with its default parameters,\n"
              "# with an empty (cold) and a filled (warm) result cache. Written by "
              "benchmarks/chapter_resources.py;\n"
              "# read by book/appendix_reproduce.md. seconds: wall time; kernel_peak_rss_bytes: the "
              "kernel's VmHWM;\n"
              "# tree_peak_rss_bytes: largest sum of RSS of the kernel and its children at any 0.1 s "
              "sample;\n"
              "# load_avg_1min: the machine's 1-minute load average before/after the run (other work "
              "slows it).\n")
    a.out.write_text(header + new.to_csv(index=False))
    print(f"wrote {a.out.relative_to(REPO) if a.out.is_relative_to(REPO) else a.out} ({len(new)} rows)")
    return 0 if (new["status"] == "ok").all() else 1


if __name__ == "__main__":
    sys.exit(main())
