"""The amendment log of data/claims.yaml against the file's git history: every change of a rule field
(comparison, tolerance, reference, quantity, ...) after a claim was declared must be an amendment
entry of that claim (old and new fields, date, reason), and every entry must be a change that happened.
Skipped, with the reason, where the git history is not available (no git, not a clone, a shallow one)."""
import functools
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from analysis import claims

ROOT = Path(__file__).resolve().parents[1]
FILE = "data/claims.yaml"
WORKTREE = "working tree"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: ~10x faster on 20 versions of 86 KB


def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def _history_or_skip():
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the history of data/claims.yaml cannot be read")
    r = _git("rev-parse", "--is-shallow-repository")
    if r.returncode != 0:
        pytest.skip("not a git clone: the history of data/claims.yaml cannot be read")
    if r.stdout.strip() == "true":
        pytest.skip("a shallow clone: the full history of data/claims.yaml is not available")
    log = _git("log", "--full-history", "--reverse", "--format=%H %P", "--", FILE)
    if log.returncode != 0 or not log.stdout.strip():
        pytest.skip("no committed history of data/claims.yaml")
    return [line.split() for line in log.stdout.splitlines()]


def _claims_at(rev):
    if rev == WORKTREE:
        return _parse((ROOT / FILE).read_text(encoding="utf-8"))
    return _claims_at_commit(rev)


@functools.lru_cache(maxsize=None)
def _claims_at_commit(rev):
    """A commit's claims (a commit never changes: read once per process; callers do not mutate it)."""
    r = _git("show", f"{rev}:{FILE}")
    return None if r.returncode != 0 else _parse(r.stdout)


def _parse(text):
    try:
        return (yaml.load(text, Loader=LOADER) or {}).get("claims") or {}
    except yaml.YAMLError:
        return None


def _fields(c):
    return {k: c[k] for k in claims.RULE_FIELDS if k in c}


def _diff(old, new):
    a, b = _fields(old), _fields(new)
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return {k: a.get(k) for k in keys}, {k: b.get(k) for k in keys}


def _changes(history, read=None):
    """[(commit, claim, [(old fields, new fields) against each parent that had the claim])] for every
    commit (merges included, and the uncommitted working tree) where a claim's rule fields differ from
    every parent's; and {claim: first commit that has it}."""
    out, first, cache = [], {}, {}
    read = read or _claims_at

    def at(rev):
        if rev not in cache:
            cache[rev] = read(rev)
        return cache[rev]
    head = _git("rev-parse", "HEAD").stdout.strip()
    for commit, *parents in [*history, [WORKTREE, head]]:
        cur = at(commit)
        if cur is None:
            continue
        olds = [at(p) for p in parents]
        for cid, c in cur.items():
            first.setdefault(cid, commit)
            before = [o[cid] for o in olds if o and cid in o]
            diffs = [_diff(b, c) for b in before]
            if before and all(d[0] or d[1] for d in diffs):
                out.append((commit, cid, diffs))
    return out, first


def _matches(a, old, new):
    keys = (set(a["old"]) | set(a["new"])) & set(claims.RULE_FIELDS)  # "format" only changes the display
    return (keys == set(old) and all(a["old"].get(k) == old[k] for k in keys)
            and all(a["new"].get(k) == new[k] for k in keys))


def _same_commit(a, commit):
    """An entry's commit names the detected one (a hash prefix); a commit that is not a hash in this
    history (e.g. the uncommitted change) is matched on its content alone."""
    c = str(a["commit"])
    if commit == WORKTREE or not re.fullmatch(r"[0-9a-f]{7,40}", c):
        return True
    return commit.startswith(c)


def test_every_rule_change_in_the_history_is_an_amendment():
    history = _history_or_skip()
    changes, _ = _changes(history)
    table = _claims_at(WORKTREE)
    missing = []
    for commit, cid, diffs in changes:
        if cid not in table:
            continue  # a claim dropped since: nothing left to show in the ledger
        ams = table[cid].get("amendments") or []
        if not any(_matches(a, old, new) and _same_commit(a, commit) for a in ams for old, new in diffs):
            old, new = diffs[0]
            missing.append(f"{cid} in {commit[:7]}: {old} -> {new}")
    assert not missing, ("rule fields changed without an amendment entry in data/claims.yaml (add one with "
                         "date, commit, old, new and reason):\n" + "\n".join(missing))


def test_every_amendment_is_a_change_that_happened():
    history = _history_or_skip()
    changes, first = _changes(history)
    table = _claims_at(WORKTREE)
    for cid, c in table.items():
        for a in c.get("amendments") or []:
            if a.get("old_rule_in"):
                # the old rule lived in a chapter's code before the claim was declared here: the new
                # fields are what the declaration wrote
                declared = _claims_at(first[cid])[cid]
                assert all(declared.get(k) == v for k, v in a["new"].items()), (cid, a["new"])
                continue
            assert any(x == cid and _same_commit(a, commit) and any(_matches(a, o, n) for o, n in diffs)
                       for commit, x, diffs in changes), (cid, a["date"], a["commit"])


def test_each_claim_says_when_its_rule_was_declared():
    history = _history_or_skip()
    _, first = _changes(history)
    for cid, c in _claims_at(WORKTREE).items():
        dec = c.get("declared")
        assert dec, f"{cid} does not say when its rule was declared (declared: commit, date)"
        assert first[cid] != WORKTREE and first[cid].startswith(str(dec["commit"])), (cid, first[cid][:7])
        shown = _git("show", "-s", "--format=%ad", "--date=short", first[cid]).stdout.strip()
        assert str(dec["date"]) == shown, (cid, dec["date"], shown)


def test_an_unlogged_change_is_caught():
    """The check itself can fail: a tolerance edited in the working tree without an entry is reported."""
    history = _history_or_skip()
    text = (ROOT / FILE).read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    cid = "ch2_fig9_saturation"
    doc["claims"][cid]["tolerance"] = doc["claims"][cid]["tolerance"] * 2
    edited = yaml.safe_dump(doc, sort_keys=False)
    changes, _ = _changes(history, lambda rev: (yaml.safe_load(edited)["claims"] if rev == WORKTREE
                                                else _claims_at(rev)))
    assert any(c == WORKTREE and x == cid for c, x, _ in changes)
    ams = doc["claims"][cid].get("amendments") or []
    assert not any(_matches(a, *d) for c, x, ds in changes if x == cid and c == WORKTREE for d in ds
                   for a in ams)
