"""Record the result of a link check in ``book/links_checked.json`` (read by ``_ext/kvbook_links.py``).

    make linkcheck                    # Sphinx's linkcheck builder, then this script
    python _ext/links_table.py        # merge _build/linkcheck/output.json into book/links_checked.json

Each external link gets the date it was checked and the result (``working``, ``redirected to ...``,
``broken: ...``, ...). Links that the check did not reach keep their previous entry. The script exits
non-zero when a link is broken, so ``make linkcheck`` fails then too.
"""
from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINKCHECK_JSON = REPO / "_build" / "linkcheck" / "output.json"
CHECKED = REPO / "book" / "links_checked.json"


def linkcheck_results(path: Path = LINKCHECK_JSON) -> dict[str, dict]:
    day = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc).date().isoformat()
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        uri, status = r.get("uri", ""), r.get("status", "")
        if not uri.startswith(("http://", "https://")):
            continue
        info = " ".join(str(r.get("info") or "").split())[:120]
        if status == "redirected":
            result = f"redirected to {info}"
        elif status in ("working", "ignored", "unchecked"):
            result = status
        else:
            result = f"{status}: {info}" if info else status
        out[uri] = {"checked": day, "result": result, "status": status}
    return out


def main() -> int:
    if not LINKCHECK_JSON.is_file():
        print(f"{LINKCHECK_JSON} is absent: run `make linkcheck` (it needs a network)", file=sys.stderr)
        return 1
    new = linkcheck_results()
    old = json.loads(CHECKED.read_text(encoding="utf-8")) if CHECKED.is_file() else {}
    old.update({u: {"checked": v["checked"], "result": v["result"]} for u, v in new.items()})
    CHECKED.write_text(json.dumps(dict(sorted(old.items())), indent=1) + "\n", encoding="utf-8")
    broken = {u: v["result"] for u, v in new.items() if v["status"] == "broken"}
    print(f"{CHECKED.relative_to(REPO)}: {len(new)} links checked, {len(broken)} broken")
    for u, why in broken.items():
        print(f"  broken: {u}: {why}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
