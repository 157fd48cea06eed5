"""Record the result of a link check in ``book/links_checked.json`` (read by ``_ext/kvbook_links.py``).

    make linkcheck                    # Sphinx's linkcheck builder, then this script
    python _ext/links_table.py        # merge the linkcheck report (output.json) into book/links_checked.json

Each external link gets the date it was checked and the result (``working``, ``redirected to ...``,
``broken: ...``, ...). A link that could not be reached because this machine has no network (name
resolution fails) is not a broken link: it keeps its previous entry. The script exits non-zero when a
link is broken or unreached, so ``make linkcheck`` fails then too.
"""
from __future__ import annotations

import datetime as dt
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# where Sphinx's linkcheck builder leaves its report: jupyter-book writes it into _build/html/
LINKCHECK_JSONS = [REPO / "_build" / "linkcheck" / "output.json", REPO / "_build" / "html" / "output.json"]
CHECKED = REPO / "book" / "links_checked.json"


NO_NETWORK = re.compile(r"NameResolution|Failed to resolve|Name or service not known|"
                        r"Temporary failure in name resolution|Network is unreachable|No route to host")


def latest_report() -> Path | None:
    found = [p for p in LINKCHECK_JSONS if p.is_file()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def linkcheck_results(path: Path) -> dict[str, dict]:
    day = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc).date().isoformat()
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        uri, status = r.get("uri", ""), r.get("status", "")
        if not uri.startswith(("http://", "https://")):
            continue
        full = " ".join(str(r.get("info") or "").split())
        info = full[:120]
        if status == "redirected":
            result = f"redirected to {info}"
        elif status in ("working", "ignored", "unchecked"):
            result = status
        else:
            result = f"{status}: {info}" if info else status
        if status == "broken" and NO_NETWORK.search(full):
            status = "unreachable"  # this machine has no network: says nothing about the link
        out[uri] = {"checked": day, "result": result, "status": status}
    return out


def main() -> int:
    report = latest_report()
    if report is None:
        print(f"no linkcheck report ({', '.join(map(str, LINKCHECK_JSONS))}): run `make linkcheck` "
              "(it needs a network)", file=sys.stderr)
        return 1
    new = linkcheck_results(report)
    old = json.loads(CHECKED.read_text(encoding="utf-8")) if CHECKED.is_file() else {}
    reached = {u: v for u, v in new.items() if v["status"] != "unreachable"}
    unreachable = sorted(set(new) - set(reached))
    old.update({u: {"checked": v["checked"], "result": v["result"]} for u, v in reached.items()})
    if reached:
        CHECKED.write_text(json.dumps(dict(sorted(old.items())), indent=1) + "\n", encoding="utf-8")
    broken = {u: v["result"] for u, v in reached.items() if v["status"] == "broken"}
    print(f"{CHECKED.relative_to(REPO)}: {len(reached)} links checked, {len(broken)} broken, "
          f"{len(unreachable)} not reached (no network here?): those keep their previous entry")
    for u, why in broken.items():
        print(f"  broken: {u}: {why}")
    return 1 if broken or unreachable else 0


if __name__ == "__main__":
    sys.exit(main())
