"""Verdicts from declared rules: every claims-ledger verdict is computed here, from the chapter's value
and the rule declared for the claim in ``data/claims.yaml`` before the value was computed.

A rule names the quantity the book computes, the setting it applies to, the reference it is compared
with (a row of ``data/published.csv``, one per setting where the figure depends on the trace, model or
GPU; or a threshold declared in the table with its reason), the comparison and its tolerance:

``two_sided``
    *reproduced* if ``|computed - ref| <= tolerance * |ref|`` (or ``abs_tolerance`` where declared),
    *partly reproduced* within ``partial_tolerance``, else *not reproduced*;
``at_least`` / ``at_most``
    one-sided, for "at least X" / "up to X" claims: ``computed >= ref - tolerance * |ref|`` (resp.
    ``<=  ref + tolerance * |ref|``), partly within ``partial_tolerance``;
``ordering``
    for "most consistent" / "gains most": the computed value is a mapping item -> score and the claimed
    ``item`` must rank first (``better``: higher or lower), partly if it ranks within ``partial_rank``;
``not_testable``
    the claim cannot be tested from public data; ``missing`` says exactly what is missing.

Rules never divide by the reference, so a published 0 is handled, and a NaN, None or missing computed
value gives *not testable* (never *not reproduced*). A claim with ``components`` (several quantities
that must all hold) gets the worst of its components' verdicts; a component may declare its own
``comparison`` (a range is an ``at_least`` and an ``at_most`` component on the same value).

Robustness: each rule declares the assumptions that move its verdict most (``sensitivity``: name, low
and high end, or ``alternatives`` for a categorical assumption, and why; no end equal to the default)
and names the one that moves its value most (``largest_driver``: name, why). :func:`evaluate`
recomputes the value at each end through a callable the chapter passes (``recompute(name, value) ->
computed``: a recomputation through the chapter's package code, never a slice of the default run) and
labels the verdict *robust* (the same at every end) or *fragile* (naming the assumption and the value
that flips it).

Settings: a reference belongs to the setting its figure was published for (``by`` + ``keys``: one
figure per setting; ``setting``: the one setting a figure or declared threshold belongs to, e.g. the
context of a published speed-up or the grid a share threshold was declared on). A rerun in another
setting is *not testable: no published figure for this setting*, never compared with another
setting's number.

Amendments: a rule changed after its value was first computed keeps the change in its ``amendments``
list (date, commit, ``old`` and ``new`` rule fields, reason; tests/test_claims_history.py checks the
list against the file's git history). :func:`evaluate` then also gives the verdict under the original
rule (:func:`original_rule`), and the verdict's label and rule text say "amended after the result".
A rule that is only a necessary condition or a bound (``pass_label: consistent``) says *consistent*
where it holds, never *reproduced*: *reproduced* means the claim's own quantity was computed and
compared.

A statistical rule is evaluated the same way: the chapter computes the rule's statistic with the
code its rule names (chapter 4's Holm-corrected tests: :func:`analysis.qevict.metrics.qevict_rule`,
through :mod:`analysis.qevict.verdicts`) and :func:`evaluate` compares it with the declared threshold.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pandas as pd
import yaml

from . import data, report

CLAIMS_FILE = data.DATA_DIR / "claims.yaml"

REPRODUCED, PARTLY, NOT_REPRODUCED, NOT_TESTABLE = ("reproduced", "partly reproduced", "not reproduced",
                                                    "not testable")
CONSISTENT = "consistent"  # a necessary condition or bound holds; the claim's own quantity is not computed
VERDICTS = (REPRODUCED, CONSISTENT, PARTLY, NOT_REPRODUCED, NOT_TESTABLE)
AMENDED = "amended after the result"
KINDS = ("two_sided", "at_least", "at_most", "ordering", "not_testable")
_RANK = {REPRODUCED: 2, PARTLY: 1, NOT_REPRODUCED: 0}
# The fields that decide a verdict: a change of any of them after the value was computed is an amendment.
RULE_FIELDS = ("claim", "quantity", "setting", "reference", "comparison", "tolerance", "partial_tolerance",
               "abs_tolerance", "components", "item", "better", "partial_rank", "alpha", "missing",
               "pass_label")
# Amended fields that change what is computed (not only how it is judged).
VALUE_FIELDS = ("claim", "quantity", "setting")


class ClaimError(ValueError):
    """A claim is not declared, or its declaration is incomplete; the message says what to add."""


@functools.lru_cache(maxsize=None)
def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh) or {}
    claims = doc.get("claims") or {}
    for cid, c in claims.items():
        check_rule(cid, c)
    return claims


def table(path=None) -> dict:
    """All declared claims (id -> rule), validated."""
    if path is None:
        data._trace_read("data/claims.yaml")  # recorded like every data read (tests compare with deps)
    return _load(str(path or CLAIMS_FILE))


def rule(claim_id: str, path=None) -> dict:
    t = table(path)
    if claim_id not in t:
        raise ClaimError(f"claim {claim_id!r} is not declared in {path or CLAIMS_FILE}; declare its rule "
                         f"(quantity, reference, comparison, tolerance and why) there before computing it")
    return t[claim_id]


def check_rule(cid: str, c: dict) -> None:
    """Raise :class:`ClaimError` when a declaration lacks what its comparison needs."""
    where = f"claim {cid!r} in data/claims.yaml"
    for key in ("claim", "source", "quantity", "comparison"):
        if key not in c:
            raise ClaimError(f"{where} lacks {key!r}")
    kind = c["comparison"]
    if kind not in KINDS:
        raise ClaimError(f"{where}: comparison {kind!r} is not one of {KINDS}")
    if kind == "not_testable":
        if not c.get("missing"):
            raise ClaimError(f"{where}: a not-testable claim must say exactly what data is missing "
                             f"('missing')")
        return
    if "why" not in c:
        raise ClaimError(f"{where} lacks 'why' (the reason for its tolerance or threshold)")
    comps = c.get("components") or [c]
    for comp in comps:
        if comp.get("comparison", kind) not in ("two_sided", "at_least", "at_most") and comp is not c:
            raise ClaimError(f"{where}: a component's comparison must be two_sided, at_least or at_most")
        if kind == "ordering":
            if "item" not in comp or comp.get("better") not in ("higher", "lower"):
                raise ClaimError(f"{where}: an ordering needs 'item' and 'better' (higher or lower)")
            continue
        ref = comp.get("reference")
        if not isinstance(ref, dict) or not ({"published", "value", "by"} & set(ref)):
            raise ClaimError(f"{where}: 'reference' must give 'published' (a key of data/published.csv), "
                             f"'value' (a declared threshold) or 'by' with 'keys' (one published key per "
                             f"setting)")
        if "tolerance" not in comp and "tolerance" not in c:
            raise ClaimError(f"{where} lacks 'tolerance'")
    for s in c.get("sensitivity") or []:
        if not ({"name", "why"} <= set(s) and ({"low", "high"} <= set(s) or s.get("alternatives"))):
            raise ClaimError(f"{where}: each sensitivity entry needs name, why and its ends: low and high, "
                             f"or 'alternatives' (the other readings of a categorical assumption)")
    _check_history(where, c)


def robustness_problems(cid: str, c: Mapping) -> list[str]:
    """What keeps a declared rule's robustness from meaning something (empty when nothing): a testable
    claim must name its largest driver (``largest_driver``: name of one of its sensitivity entries, and
    why), and every sensitivity entry must declare its default and ends that differ from it (an end at
    the default recomputes nothing)."""
    if c.get("comparison") == "not_testable":
        return []
    out = []
    sens = c.get("sensitivity") or []
    drv = c.get("largest_driver")
    if not isinstance(drv, Mapping) or not {"name", "why"} <= set(drv):
        out.append(f"{cid}: no 'largest_driver' (name of the sensitivity entry that moves the value most, "
                   f"and why)")
    elif drv["name"] not in {s["name"] for s in sens}:
        out.append(f"{cid}: largest_driver {drv['name']!r} is not one of its sensitivity entries")
    for s in sens:
        if "default" not in s:
            out.append(f"{cid}: sensitivity {s['name']!r} does not declare its default")
        elif any(_same(e, s["default"]) for e in ends(s)):
            out.append(f"{cid}: sensitivity {s['name']!r} has an end equal to its default ({s['default']!r})")
    return out


def _same(a, b) -> bool:
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def ends(s: Mapping) -> list:
    """The values a sensitivity entry is recomputed at: its ``low`` and ``high`` ends, or its
    ``alternatives`` (the other readings of a categorical assumption, or the values on the one side of
    a default that sits at the edge of its range)."""
    if s.get("alternatives"):
        return list(s["alternatives"])
    return [s["low"], s["high"]]


def _check_history(where: str, c: dict) -> None:
    if c.get("pass_label") not in (None, CONSISTENT):
        raise ClaimError(f"{where}: pass_label may only be {CONSISTENT!r}")
    dec = c.get("declared")
    if dec is not None and not (isinstance(dec, dict) and {"commit", "date"} <= set(dec)):
        raise ClaimError(f"{where}: 'declared' needs the commit and date the rule was declared")
    for a in c.get("amendments") or []:
        if not {"date", "commit", "old", "new", "reason"} <= set(a):
            raise ClaimError(f"{where}: each amendment needs date, commit, old, new and reason")
        bad = (set(a["old"]) | set(a["new"])) - set(RULE_FIELDS) - {"format"}  # format: display only
        if bad:
            raise ClaimError(f"{where}: an amendment may only change rule fields, not {sorted(bad)}")


def amendments(claim_id_or_rule) -> list:
    """The rule's amendments (changes after its value was first computed), oldest first."""
    c = rule(claim_id_or_rule) if isinstance(claim_id_or_rule, str) else claim_id_or_rule
    return list(c.get("amendments") or [])


def original_rule(claim_id_or_rule) -> dict:
    """The rule as first declared: the current one with every amendment undone, newest first (a field
    an amendment added is removed; one it changed gets its old value back)."""
    c = rule(claim_id_or_rule) if isinstance(claim_id_or_rule, str) else claim_id_or_rule
    out = {k: v for k, v in c.items() if k not in ("amendments", "sensitivity")}
    for a in reversed(amendments(c)):
        for k in a["new"]:
            if k not in a["old"]:
                out.pop(k, None)
        for k, v in a["old"].items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = v
    return out


def _missing(x) -> bool:
    if x is None:
        return True
    try:
        return not math.isfinite(float(x))
    except (TypeError, ValueError):
        return True


def reference(comp: dict, setting: Mapping | None = None) -> tuple[float | None, str]:
    """The reference value of a rule (or component) in a setting, and where it comes from."""
    ref = comp["reference"]
    scale = float(ref.get("scale", 1.0))
    for k, want in (ref.get("setting") or {}).items():  # the setting the figure or threshold belongs to
        val = (setting or {}).get(k, want)
        if not _same(val, want):
            return None, f"no published figure for this setting ({k} {val!r}; the figure is for {want!r})"
    if "value" in ref:
        return float(ref["value"]) * scale, "declared threshold"
    key = ref.get("published")
    if "by" in ref:
        val = (setting or {}).get(ref["by"])
        key = (ref.get("keys") or {}).get(val)
        if key is None:
            return None, f"no published figure for {ref['by']} {val!r}"
    row = data.published(key)
    return float(row["value"]) * scale, key


def _setting_text(ref: Mapping, setting: Mapping | None) -> str:
    """' (published for trace mooncake_conversation)': the setting a keyed reference belongs to."""
    keys = ([ref["by"]] if "by" in ref else []) + list(ref.get("setting") or {})
    vals = {k: (setting or {}).get(k, (ref.get("setting") or {}).get(k)) for k in keys}
    return f" (for {', '.join(f'{k} {v}' for k, v in vals.items())})" if vals else ""


def _fmt(x, unit_fmt: str | None) -> str:
    if _missing(x):
        return "n/a"
    return (unit_fmt or "{:.3g}").format(float(x))


def rule_text(claim_id_or_rule, setting: Mapping | None = None) -> str:
    """The declared rule in words, shown next to every verdict."""
    c = rule(claim_id_or_rule) if isinstance(claim_id_or_rule, str) else claim_id_or_rule
    kind = c["comparison"]
    if kind == "not_testable":
        return f"not testable: {c['missing']}"
    if kind == "ordering":
        comp = c
        part = f", partly if within the first {comp['partial_rank']}" if comp.get("partial_rank") else ""
        return (f"ordering: reproduced if {comp['item']} ranks first ({comp['better']} is better) on "
                f"{c['quantity']}{part}")
    parts = []
    for comp in c.get("components") or [c]:
        tol = comp.get("tolerance", c.get("tolerance"))
        ptol = comp.get("partial_tolerance", c.get("partial_tolerance"))
        atol = comp.get("abs_tolerance", c.get("abs_tolerance"))
        ref, src = reference(comp, setting)
        fmt = comp.get("format", c.get("format"))
        name = comp.get("name", "")
        r = _fmt(ref, fmt) if ref is not None else f"none ({src})"
        if ref is not None:
            r += _setting_text(comp["reference"], setting)
        head = f"{name}: " if name else ""
        pv = comp["reference"].get("partial_value")
        ckind = comp.get("comparison", kind)
        if ckind == "two_sided":
            band = f"{tol:.0%}" + (f" (or ±{_fmt(atol, fmt)})" if atol else "")
            pband = f"; partly within ±{ptol:.0%}" if ptol else ""
            parts.append(f"{head}within ±{band} of {r}{pband}")
            continue
        sign = -1 if ckind == "at_least" else 1
        word = "at least" if ckind == "at_least" else "at most"
        lead = f"{word} {1 + sign * tol:.0%} of {r}" if tol else f"{word} {r}"
        pband = f"; partly if {word} {1 + sign * ptol:.0%} of it" if ptol else ""
        if pv is not None:
            pband += f"; partly if {word} {_fmt(pv, fmt)}"
        parts.append(f"{head}{lead}{pband}")
    kinds = {comp.get("comparison", kind) for comp in c.get("components") or [c]}
    names = {"two_sided": "two-sided", "at_least": "one-sided (at least)", "at_most": "one-sided (at most)"}
    what = "range" if kinds == {"at_least", "at_most"} else names[kind]
    if c.get("pass_label") == CONSISTENT:
        return (f"{what}, a necessary condition only: consistent (never reproduced) if " + "; ".join(parts))
    return f"{what}: reproduced if " + "; ".join(parts)


def _compare(kind, x, ref, tol, ptol, atol, pref=None) -> str:
    if _missing(x) or ref is None or _missing(ref):
        return NOT_TESTABLE

    def ok(t):
        band = max(float(t) * abs(ref), float(atol or 0.0))
        if kind == "two_sided":
            return abs(x - ref) <= band
        if kind == "at_least":
            return x >= ref - band
        return x <= ref + band
    if ok(tol):
        return REPRODUCED
    if ptol is not None and ok(ptol):
        return PARTLY
    if pref is not None and (x >= pref if kind == "at_least" else x <= pref if kind == "at_most" else False):
        return PARTLY
    return NOT_REPRODUCED


def _ordering(comp, scores) -> tuple[str, str]:
    if not isinstance(scores, Mapping):
        return NOT_TESTABLE, "no scores computed"
    item = comp["item"]
    s = {k: float(v) for k, v in scores.items() if not _missing(v)}
    if item not in s:
        return NOT_TESTABLE, f"no finite score for {item}"
    sign = -1.0 if comp["better"] == "higher" else 1.0
    rank = 1 + sum(1 for k, v in s.items() if k != item and sign * v < sign * s[item])
    detail = f"{item} ranks {rank} of {len(s)}"
    if rank == 1:
        return REPRODUCED, detail
    if comp.get("partial_rank") and rank <= int(comp["partial_rank"]):
        return PARTLY, detail
    return NOT_REPRODUCED, detail


def _verdict(c: dict, computed, setting) -> tuple[str, str, list]:
    """Verdict, detail and the per-component (name, computed, reference, verdict); a rule that is only a
    necessary condition (``pass_label: consistent``) says *consistent* where it holds."""
    v, detail, out = _verdict_raw(c, computed, setting)
    if v == REPRODUCED and c.get("pass_label") == CONSISTENT:
        v = CONSISTENT
    return v, detail, out


def _verdict_raw(c: dict, computed, setting) -> tuple[str, str, list]:
    kind = c["comparison"]
    if kind == "not_testable":
        return NOT_TESTABLE, c["missing"], []
    if kind == "ordering":
        v, d = _ordering(c, computed)
        return v, d, []
    comps = c.get("components")
    if comps:
        if not isinstance(computed, Mapping):
            return NOT_TESTABLE, "no values computed", []
        values = [(comp["name"], computed.get(comp["name"]), comp) for comp in comps]
    else:
        values = [("", computed, c)]
    out, reasons = [], []
    for name, x, comp in values:
        ref, src = reference(comp, setting)
        x = None if _missing(x) else float(x)
        pv = comp["reference"].get("partial_value")
        v = _compare(comp.get("comparison", kind), x, ref, comp.get("tolerance", c.get("tolerance")),
                     comp.get("partial_tolerance", c.get("partial_tolerance")),
                     comp.get("abs_tolerance", c.get("abs_tolerance")),
                     None if pv is None else float(pv) * float(comp["reference"].get("scale", 1.0)))
        if v == NOT_TESTABLE:
            reasons.append(src if ref is None else f"{name or c['quantity']} not computed")
        out.append((name, x, ref, v))
    vs = [o[3] for o in out]
    if NOT_TESTABLE in vs:
        return NOT_TESTABLE, "; ".join(reasons), out
    worst = min(vs, key=_RANK.get)
    return worst, "", out


@dataclass
class Verdict:
    claim_id: str
    verdict: str
    rule: str
    computed: object = None
    reference: float | None = None
    detail: str = ""
    robustness: str = ""
    flips: list = field(default_factory=list)
    components: list = field(default_factory=list)
    amended: list = field(default_factory=list)  # dates of the rule's amendments after the result
    original_verdict: str | None = None  # the verdict under the rule as first declared (None: not amended)
    original_rule: str = ""

    @property
    def label(self) -> str:
        """Verdict with its robustness label, e.g. 'reproduced (robust)'; a not-testable verdict says why;
        an amended rule says so, with the verdict under the original rule (not where no value was computed:
        then neither rule can judge, and the rule text still names the amendment)."""
        if self.verdict == NOT_TESTABLE:
            out = f"{NOT_TESTABLE}: {self.detail}" if self.detail else NOT_TESTABLE
        else:
            out = f"{self.verdict} ({self.robustness})" if self.robustness else self.verdict
        if self.amended and not (self.verdict == self.original_verdict == NOT_TESTABLE):
            out += f"; {AMENDED} ({', '.join(dict.fromkeys(self.amended))}): under the original rule, " \
                   f"{self.original_verdict}"
        return out

    @property
    def difference(self) -> float:
        """computed / reference - 1 (NaN where the reference is 0 or either is missing)."""
        try:
            x, r = float(self.computed), float(self.reference)
        except (TypeError, ValueError):
            return float("nan")
        return x / r - 1 if r and math.isfinite(x) and math.isfinite(r) else float("nan")


def _fmt_value(v) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def evaluate(claim_id: str, computed, setting: Mapping | None = None,
             recompute: Callable[[str, object], object] | None = None, path=None,
             missing: str | None = None) -> Verdict:
    """The verdict of ``claim_id`` for ``computed`` under its declared rule, with robustness.

    ``recompute(name, value)`` returns the computed value with assumption ``name`` at ``value``
    (the others at their defaults); it is called at the low and high end of each declared assumption.
    ``missing`` says what data is missing when the chapter could not compute the value (e.g. "2
    documents with results (the declared rule needs at least 3)"): a not-testable verdict then says
    that instead of naming the quantity."""
    c = rule(claim_id, path)
    v, detail, comps = _verdict(c, computed, setting)
    if v == NOT_TESTABLE and missing and c["comparison"] != "not_testable" and any(
            x is None for _, x, _, _ in comps):
        detail = missing
    ref = comps[0][2] if len(comps) == 1 else None
    out = Verdict(claim_id, v, rule_text(c, setting), computed, ref, detail, components=comps)
    if amendments(c):
        out.amended = [str(a["date"]) for a in amendments(c)]
        out.original_verdict, out.original_rule = _original(c, computed, setting, recompute)
        if v == NOT_TESTABLE and c["comparison"] != "not_testable":
            out.original_verdict = NOT_TESTABLE  # no value: no rule, original or amended, can judge it
        dates = ", ".join(dict.fromkeys(out.amended))
        same = out.original_rule == out.rule
        out.rule += f" ({AMENDED} on {dates}; " + (
            "the original rule, restored)" if same else f"original rule: {out.original_rule})")
    sens = c.get("sensitivity") or []
    if v == NOT_TESTABLE or c["comparison"] == "not_testable":
        return out
    if not sens:
        out.robustness = "no assumption declared"
        return out
    if recompute is None:
        out.robustness = "robustness not assessed"
        return out
    unassessed = []
    for s in sens:
        for val in ends(s):
            v2, _, _ = _verdict(c, recompute(s["name"], val), setting)
            if v2 == NOT_TESTABLE:  # the value could not be recomputed there: say so, do not call it a flip
                unassessed.append(f"{s['name']} = {_fmt_value(val)}")
            elif v2 != v:
                out.flips.append((s["name"], val, v2))
    # "robust to" names only the assumptions recomputed at one end at least
    names = ", ".join(dict.fromkeys(s["name"] for s in sens
                                    if sum(u.startswith(s["name"] + " = ") for u in unassessed)
                                    < len(ends(s))))
    if len(unassessed) == sum(len(ends(s)) for s in sens):
        out.robustness = f"robustness not assessed: no value at {', '.join(unassessed)}"
        return out
    if not out.flips:
        out.robustness = f"robust to {names}"
    else:
        out.robustness = "fragile: " + "; ".join(f"{v2} when {n} = {_fmt_value(val)}"
                                                 for n, val, v2 in out.flips)
    if unassessed:
        out.robustness += f"; not assessed at {', '.join(unassessed)}"
    return out


def _original(c: dict, computed, setting, recompute) -> tuple[str, str]:
    """(verdict, rule in words) under the rule as first declared. Where an amendment changed the quantity
    or setting, the value the original rule judged is recomputed through the assumption the amendment
    names (``original_value: {sensitivity: name, value: v}``); without one it is not recomputed."""
    orig = original_rule(c)
    try:
        text = rule_text(orig, setting)
    except (KeyError, TypeError, ValueError, ClaimError):
        text = "as in the amendments of data/claims.yaml"
    changed = [a for a in amendments(c) if not a.get("same_value")
               and (set(a["old"]) | set(a["new"])) & set(VALUE_FIELDS)]
    value = computed
    if changed:
        hints = {(a["original_value"]["sensitivity"], str(a["original_value"]["value"]))
                 for a in changed if a.get("original_value")}
        if len(hints) != 1 or any(not a.get("original_value") for a in changed):
            return ("not recomputed (the original quantity is no longer computed)",
                    f"{text}, on the quantity as first declared")
        name, val = next(a["original_value"] for a in changed).values()
        text += f", on the value at {name} = {_fmt_value(val)}"
        if recompute is None:
            return "not assessed (no value for the original quantity)", text
        value = recompute(name, val)
    if c["comparison"] == "not_testable" and orig["comparison"] != "not_testable":
        return "not recomputed (the claim was made not testable, so no value is computed)", text
    try:
        v, _, _ = _verdict(orig, value, setting)
    except (KeyError, TypeError, ValueError, ClaimError):
        return "not recomputed (the original rule is incomplete)", text
    return v, text


def glue_verdict(name: str, v: Verdict) -> str:
    """Glue ``name`` (verdict with robustness label) and ``name_rule`` (the rule in words)."""
    report.glue(name + "_rule", v.rule)
    return report.glue(name, v.label)


def counts(verdicts) -> dict:
    """How many verdicts of each label (not-testable ones counted together), and how many of them rest
    on a rule amended after the result (``AMENDED``; counted besides their label)."""
    out = {k: 0 for k in VERDICTS}
    out[AMENDED] = 0
    for v in verdicts:
        out[v.verdict] += 1
        out[AMENDED] += bool(getattr(v, "amended", None))  # a verdict-like record may not carry it
    return out


def counts_text(verdicts) -> str:
    """E.g. '3 reproduced, 1 consistent, 2 not testable (2 of them amended after the result)'."""
    c = counts(verdicts)
    n_am = c.pop(AMENDED)
    out = ", ".join(f"{n} {k}" for k, n in c.items() if n) or "no verdicts"
    if n_am:
        out += f" ({n_am} of them {AMENDED})"
    return out


def declared_counts(path=None) -> dict:
    """Counts over the declared rules of ``data/claims.yaml`` (no value needed): claims, rules amended
    after the result, rules that can only say *consistent* (necessary conditions and bounds), claims not
    testable from public data, and claims whose value is recomputed under their original rule."""
    t = table(path)
    return {"claims": len(t),
            AMENDED: sum(bool(c.get("amendments")) for c in t.values()),
            CONSISTENT: sum(c.get("pass_label") == CONSISTENT for c in t.values()),
            NOT_TESTABLE: sum(c["comparison"] == "not_testable" for c in t.values())}


def declared_counts_text(path=None) -> str:
    c = declared_counts(path)
    return (f"{c['claims']} claims: {c[AMENDED]} with a rule {AMENDED} (each shown with its verdict under "
            f"the original rule), {c[CONSISTENT]} that a computed bound can only show {CONSISTENT}, "
            f"{c[NOT_TESTABLE]} {NOT_TESTABLE} from public data")


def frame(verdicts, fmt: Mapping | None = None):
    """A table for readers: claim, reference, computed, rule, verdict (no index column)."""
    rows = []
    for v in verdicts:
        c = rule(v.claim_id)
        f = (fmt or {}).get(v.claim_id) or c.get("format") or "{:.3g}"
        if isinstance(v.computed, Mapping):
            comp = "; ".join(f"{k}: {_fmt(x, f)}" for k, x in v.computed.items())
        else:
            comp = _fmt(v.computed, f) if not isinstance(v.computed, str) else v.computed
        rows.append({"claim": c["claim"], "this book computes": comp,
                     "rule (declared in data/claims.yaml)": v.rule, "verdict": v.label})
    return pd.DataFrame(rows)
