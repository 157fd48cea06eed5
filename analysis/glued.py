"""Every glued value of the built book, recorded and compared: nothing a reader sees changes silently.

``python -m analysis.glued record`` reads the executed pages of the last ``make book`` (the
jupyter-cache under ``_build/``) and writes ``tests/data/glued_baseline.json`` (page -> glue name ->
raw value). ``python -m analysis.glued diff`` lists every key whose value differs from that record
beyond a relative tolerance of 1e-9, every key added and every key removed.
``tests/data/glued_changes.yaml`` names the changes that are explained (``"page::key": reason``);
``tests/test_glued_values.py`` fails on any other change, and on an explanation whose key no longer
differs (so the file says only what is true). ``record`` takes a new baseline and empties the
explanations: do it when a release's changes have been explained and reviewed.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import yaml

from .report import glued_values

REPO = Path(__file__).resolve().parent.parent
JCACHE = REPO / "_build" / ".jupyter_cache"
BASELINE = REPO / "tests" / "data" / "glued_baseline.json"
EXPLAINED = REPO / "tests" / "data" / "glued_changes.yaml"
REL_TOL = 1e-9
# Wall-clock measurements of the run itself (seconds, rates): they differ on every execution, so the
# record does not compare them. Only measured times belong here, never a modelled quantity.
VOLATILE = frozenset({
    "02_ssd_offload::ch2_curve_seconds", "02_ssd_offload::ch2_fig10_seconds",
    "02_ssd_offload::ch2_vllm_seconds", "02_ssd_offload::ch2_vllm_curve_seconds",
    "02_ssd_offload_evidence::ch2_adm_seconds_max", "02_ssd_offload_evidence::ch2_route_seconds",
    "02_ssd_offload_evidence::ch2_route_slo_seconds", "02_ssd_offload_evidence::ch2_agent_curve_seconds",
    "03_disagg::ch3_plans_per_s", "03_disagg_evidence::ch3_des_wall_max",
    "05_where_kv_lives::ch5_map_seconds",
    "05_where_kv_lives::ch5_t_reuse",
})


class GluedError(RuntimeError):
    """The executed pages or the baseline cannot be read; the message says what to run."""


def executed_pages(jcache: Path = JCACHE) -> dict[str, dict]:
    """Raw glued values of every page executed by the last build: ``{page stem: {name: value}}``."""
    from jupyter_cache import get_cache  # optional heavy dependency

    if not Path(jcache).exists():
        raise GluedError(f"no executed pages under {jcache}: run `make book` first")
    cache = get_cache(str(jcache))
    out = {}
    for rec in cache.list_cache_records():
        nb = cache.get_cache_bundle(rec.pk).nb
        values = glued_values(nb)
        if values:
            out[Path(rec.uri).stem] = values
    return out


def _close(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return abs(a - b) <= REL_TOL * max(abs(a), abs(b)) or abs(a - b) < 1e-300
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return a == b


def diff(before: dict[str, dict], after: dict[str, dict]) -> dict[str, dict]:
    """``{"page::key": {"before": v0, "after": v1}}`` for every key changed, added (before ``None``,
    ``"added": True``) or removed (``"removed": True``), pages missing on one side included."""
    out = {}
    for page in sorted(set(before) | set(after)):
        b, a = before.get(page, {}), after.get(page, {})
        for key in sorted(set(b) | set(a)):
            k = f"{page}::{key}"
            if k in VOLATILE and key in a and key in b:
                continue
            if key not in a:
                out[k] = {"before": b[key], "after": None, "removed": True}
            elif key not in b:
                out[k] = {"before": None, "after": a[key], "added": True}
            elif not _close(b[key], a[key]):
                out[k] = {"before": b[key], "after": a[key]}
    return out


def load_baseline(path: Path = BASELINE) -> dict[str, dict]:
    if not Path(path).exists():
        raise GluedError(f"no glued-value baseline at {path}: "
                         "`python -m analysis.glued record` after a build")
    return json.loads(Path(path).read_text())["pages"]


def load_explained(path: Path = EXPLAINED) -> dict[str, str]:
    if not Path(path).exists():
        return {}
    text = Path(path).read_text()
    data = yaml.safe_load(text) or {}
    # YAML keeps the last of two equal keys silently: two merged branches explaining one key would hide
    # one reason
    keys = [n.value for n, _ in yaml.compose(text).value] if data else []
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise GluedError(f"{path}: keys explained twice (keep one reason each): {twice}")
    bad = [k for k, v in data.items() if not isinstance(v, str) or not v.strip()]
    if bad:
        raise GluedError(f"{path}: every explained change needs a reason (text); missing for {bad}")
    return data


def unexplained(changes: dict[str, dict], explained: dict[str, str]) -> tuple[list[str], list[str]]:
    """(changed keys without an explanation, explained keys that no longer differ)."""
    return sorted(set(changes) - set(explained)), sorted(set(explained) - set(changes))


def record(pages: dict[str, dict], commit: str, path: Path = BASELINE, explained: Path = EXPLAINED) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"commit": commit, "pages": pages}, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    explained.write_text("# page::glue key: why its value differs from tests/data/glued_baseline.json\n{}\n")


def _short(v) -> str:
    s = json.dumps(v)
    return s if len(s) <= 70 else s[:67] + "..."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.glued", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=["record", "diff"])
    ap.add_argument("--cache", type=Path, default=JCACHE, help="jupyter-cache folder of a build")
    ap.add_argument("--commit", help="record: the commit the build ran (default: HEAD)")
    a = ap.parse_args(argv)
    try:
        pages = executed_pages(a.cache)
        if a.action == "record":
            commit = a.commit or subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                                text=True).stdout.strip()
            record(pages, commit)
            print(f"recorded {sum(map(len, pages.values()))} glued values of {len(pages)} pages "
                  f"at {commit[:10]} into {BASELINE.relative_to(REPO)}")
            return 0
        changes = diff(load_baseline(), pages)
        explained = load_explained()
    except GluedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for k, c in changes.items():
        tag = "added" if c.get("added") else "removed" if c.get("removed") else "changed"
        why = explained.get(k, "UNEXPLAINED")
        print(f"{tag:8s} {k}: {_short(c['before'])} -> {_short(c['after'])}   [{why}]")
    missing, stale = unexplained(changes, explained)
    for k in stale:
        print(f"explained but unchanged: {k}")
    print(f"{len(changes)} changed, {len(missing)} unexplained, {len(stale)} explanations no longer needed")
    return 1 if missing or stale else 0


if __name__ == "__main__":
    sys.exit(main())
