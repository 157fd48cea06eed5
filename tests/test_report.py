"""Glued text survives myst-nb's own formatting unchanged."""
import pytest
from myst_nb.core.variables import format_plain_text

from analysis import report


@pytest.mark.parametrize("value,fmt,want", [
    (4456, None, "4,456"), (28538, "{:,}", "28,538"), (0.123, "{:.1%}", "12.3%"), ("(1, 2)", None, "(1, 2)"),
    (327680, "bytes", "328 kB"), (-3.5, "{:+.1f}", "-3.5"), (True, None, "True"),
    ("reproduced", None, "reproduced"),
])
def test_glue_text_round_trips_through_myst_nb(monkeypatch, value, fmt, want):
    shown = {}
    monkeypatch.setattr("IPython.display.display",
                        lambda data, **kw: shown.update(data=data, md=kw["metadata"]))
    assert report.glue("k", value, fmt) == want
    plain = shown["data"][report.GLUE_PREFIX + "text/plain"]
    assert format_plain_text(plain, "s") == want
    assert shown["md"]["kvbook"]["value"] == value


def test_a_cell_ending_in_glue_shows_no_bare_string(monkeypatch):
    from IPython.core.formatters import DisplayFormatter

    monkeypatch.setattr("IPython.display.display", lambda data, **kw: None)
    out = report.glue("k", 0.5, "{:.0%}")
    assert out == "50%" and isinstance(out, str)
    data, md = DisplayFormatter().format(out)  # what the displayhook would show as Out[...]
    assert data == {}
    data, _ = DisplayFormatter().format("50%")  # a plain str would be shown
    assert data.get("text/plain") == "'50%'"
