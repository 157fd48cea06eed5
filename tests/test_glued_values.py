"""Nothing a reader sees changes silently: every glued value of the last build against the record."""
import pytest

from analysis import glued


def test_diff_finds_changed_added_and_removed_keys():
    before = {"p": {"a": 1.0, "b": "x", "c": [1, 2], "gone": 3}}
    after = {"p": {"a": 1.0 + 1e-12, "b": "y", "c": [1, 2.5], "new": 4}}
    d = glued.diff(before, after)
    assert set(d) == {"p::b", "p::c", "p::gone", "p::new"}  # 1e-12 relative is within tolerance
    assert d["p::gone"]["removed"] and d["p::new"]["added"]
    assert glued.diff(before, before) == {}
    assert glued.diff({"p": {"x": float("nan")}}, {"p": {"x": float("nan")}}) == {}
    assert set(glued.diff({"p": {"x": 1.0}}, {"p": {"x": 1.0 + 1e-8}})) == {"p::x"}


def test_measured_wall_times_are_not_compared_but_their_presence_is():
    key = sorted(glued.VOLATILE)[0]
    page, name = key.split("::")
    assert glued.diff({page: {name: 1.0}}, {page: {name: 2.0}}) == {}
    assert set(glued.diff({page: {name: 1.0}}, {page: {}})) == {key}  # removed is still a change


def test_every_volatile_key_is_a_recorded_glue_key():
    """A misspelt volatile key would exempt nothing: each is in the record, or is a key added since
    and explained in tests/data/glued_changes.yaml (a page that did not exist when it was recorded)."""
    recorded = {f"{p}::{k}" for p, vals in glued.load_baseline().items() for k in vals}
    recorded |= set(glued.load_explained())
    assert glued.VOLATILE <= recorded, sorted(glued.VOLATILE - recorded)


def test_unexplained_lists_both_directions():
    changes = {"p::a": {}, "p::b": {}}
    assert glued.unexplained(changes, {"p::a": "fixed a double count", "p::z": "old"}) == (["p::b"], ["p::z"])


@pytest.mark.notebook
def test_every_glued_value_equals_the_record_or_is_explained():
    if not glued.JCACHE.exists():
        pytest.skip("no book build in this checkout (make test builds the book before pytest)")
    changes = glued.diff(glued.load_baseline(), glued.executed_pages())
    missing, stale = glued.unexplained(changes, glued.load_explained())
    short = glued._short
    lines = [f"{k}: {short(changes[k]['before'])} -> {short(changes[k]['after'])}" for k in missing]
    assert not missing, ("glued values changed without an explanation in tests/data/glued_changes.yaml "
                         "(python -m analysis.glued diff):\n" + "\n".join(lines))
    assert not stale, f"explained in tests/data/glued_changes.yaml but no longer changed: {stale}"
