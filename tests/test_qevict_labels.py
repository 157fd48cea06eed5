"""Issue 29 item 4: a policy that cannot fit its budget and evicts is named so wherever chapter 4 shows
it (analysis.qevict.labels), from the runs' ``fits`` flags; every chapter-4 label goes through it."""
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from analysis import plots  # noqa: E402
from analysis.qevict import chapter as ch  # noqa: E402
from analysis.qevict import figures as qfig  # noqa: E402
from analysis.qevict import labels as ql  # noqa: E402
from analysis.qevict.experiment import summary_table  # noqa: E402
from analysis.qevict.policies import POLICY_LABELS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MARK = ql.EVICTS_TO_FIT


def _summary(unfit=(("kivi2", 0.2),)):
    """Two documents, three budgets; ``unfit``: (policy, budget) streams that did not fit on the first
    document only (so 'any stream' matters, not 'all')."""
    rows = []
    for d, doc in enumerate(("code:x", "needle:y")):
        for pol, kl in (("full", 0.0), ("h2o", 0.3), ("kivi2", 0.01), ("kivi4", 0.2),
                        ("qevict_recall", 0.05)):
            for b in (0.2, 0.35, 0.5):
                rows.append(dict(document=doc, genre=doc.split(":")[0], policy=pol, label=POLICY_LABELS[pol],
                                 budget=b, kl=kl * (1 - b) * (1 + d), fits=not (d == 0 and (pol, b) in unfit),
                                 fmm=0.1, fmm_quantized=0.05, fmm_evicted=0.05, dppl=kl, top1=1 - kl,
                                 device_frac=b, offdevice_frac=0.0, recall_bytes_per_step=0.0,
                                 needle_acc=np.nan, promotions=0, recall_bytes=0.0, decode_steps=8))
    return pd.DataFrame(rows)


def test_display_label_says_evicts_to_fit_only_with_unfit_budgets():
    assert ql.display_label("kivi2") == POLICY_LABELS["kivi2"]
    assert ql.display_label("kivi2", (0.2, 0.1)) == f"{POLICY_LABELS['kivi2']} ({MARK} at 10%, 20%)"
    assert ql.display_label("h2o", ()) == POLICY_LABELS["h2o"]


def test_names_come_from_the_fits_flags_not_from_the_policy():
    names = ql.display_labels(_summary())
    assert names["kivi2"] == f"{POLICY_LABELS['kivi2']} ({MARK} at 20%)"  # one document's stream suffices
    assert MARK not in names["kivi4"] and MARK not in names["h2o"] and MARK not in names["full"]
    # the same KIVI fitting everywhere is named plainly; any policy that did not fit is named so
    assert ql.display_labels(_summary(unfit=()))["kivi2"] == POLICY_LABELS["kivi2"]
    other = ql.display_labels(_summary(unfit=(("h2o", 0.5), ("h2o", 0.35))))
    assert other["h2o"] == f"{POLICY_LABELS['h2o']} ({MARK} at 35%, 50%)" and MARK not in other["kivi2"]


def test_with_display_labels_keeps_one_name_per_policy_across_budgets():
    s = ql.with_display_labels(_summary())
    assert s[s.policy == "kivi2"].label.nunique() == 1 and MARK in s[s.policy == "kivi2"].label.iloc[0]
    assert (s[s.policy == "h2o"].label == POLICY_LABELS["h2o"]).all()
    assert ql.with_display_labels(s).equals(s)  # idempotent
    with pytest.raises(ValueError, match="fits"):
        ql.display_labels(s.drop(columns="fits"))


def test_evicts_to_fit_text_names_the_policies_and_budgets():
    assert ql.evicts_to_fit_text(_summary()) == f"{POLICY_LABELS['kivi2']} at 20%"
    assert ql.evicts_to_fit_text(_summary(unfit=())).startswith("none")


def test_the_run_summary_carries_the_display_names():
    raw = _summary()
    s = summary_table([raw[raw.document == d].drop(columns="genre") for d in raw.document.unique()])
    assert "genre" in s and MARK in s[s.policy == "kivi2"].label.iloc[0]
    assert MARK not in s[s.policy == "kivi4"].label.iloc[0]


def test_tables_and_glue_name_a_non_fitting_policy_so():
    s = _summary()
    sp = ch.compressed(s)
    tbl = ch.outcomes_table(sp)  # labels from the fits flags even if the summary came unnamed
    assert set(tbl[tbl.label.str.startswith("KIVI 2")].label) == {ql.display_labels(s)["kivi2"]}
    g = dict((n, v) for n, v, _ in ch.best_glue(tbl, [0.2, 0.35, 0.5]))
    assert g["ch4_best_20"] == ql.display_labels(s)["kivi2"]  # the best at 20% evicted there
    rules = pd.DataFrame({"baseline": ["kivi2", "h2o"], "budget": [0.2, 0.2], "outcome": ["worse", "better"]})
    v = dict((n, v) for n, v, _ in ch.verdict_glue(rules, 1, ql.names_of(s)))
    assert MARK in v["ch4_baselines_failed"] and MARK not in v["ch4_baselines_passed"]
    ex = dict((n, v) for n, v, _ in ch.fmm_example_glue(ql.with_display_labels(sp), ["kivi2"], [0.2, 0.35]))
    assert ex["ch4_fmm_ex_where"].startswith(ql.display_labels(s)["kivi2"])


def test_figures_name_a_non_fitting_policy_so():
    s = ql.with_display_labels(_summary())
    names = ql.names_of(s)
    keys, order, pal, mk = qfig.policy_styles(["full", "h2o", "kivi2", "kivi4"], plots.PALETTE, plots.MARKERS,
                                              names)
    assert order == [names["h2o"], names["kivi2"], names["kivi4"]] and MARK in order[1]
    rules = pd.DataFrame({"baseline": ["kivi2", "h2o"], "budget": [0.2, 0.2], "ratio": [0.9, 0.8],
                          "lo": [0.8, 0.7], "hi": [1.0, 0.9], "outcome": ["unclear", "better"]})
    fig = qfig.fig_qevict_forest(rules, 2, names)
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    plt.close(fig)
    assert any(MARK in t and t.startswith("KIVI 2") for t in ticks) and not any(MARK in t for t in ticks
                                                                                if t.startswith("H2O"))
    ratios = qfig.genre_kl_ratios(s, "qevict_recall", ["h2o", "kivi2"], {})
    assert names["kivi2"] in ratios.columns and POLICY_LABELS["h2o"] in ratios.columns


def test_committed_long_runs_name_kivi_where_it_evicted():
    from analysis.qevict.longview import long_results, main_comparison

    arts, _, lt = long_results()
    if not len(lt):
        pytest.skip("no long run committed")
    for pol, t in lt.groupby("policy"):
        unfit = set()
        for a in arts:
            sa = a.tables["summary"]
            unfit |= set(sa[(sa.policy == pol) & ~sa.fits.astype(bool)].budget)
        assert (MARK in t.label.iloc[0]) == bool(unfit), (pol, t.label.iloc[0])
    main = main_comparison(arts)
    if main is not None:
        sm = main["summary"]
        assert sm.groupby("policy").label.nunique().max() == 1
        assert any(MARK in x for x in sm.label.unique())  # KIVI evicts at 10% in the committed main runs


# every chapter-4 module that shows a policy's name, and the chapter itself: names come from
# analysis.qevict.labels, never from POLICY_LABELS directly (nor a hand-written policy name list)
PRESENTING = ["analysis/qevict/chapter.py", "analysis/qevict/figures.py", "analysis/qevict/longview.py",
              "analysis/qevict/failures.py", "analysis/qevict/experiment.py", "book/04_qevict.md",
              "book/04_qevict_evidence.md"]


@pytest.mark.parametrize("path", PRESENTING)
def test_every_chapter_4_label_goes_through_the_labels_module(path):
    text = (ROOT / path).read_text()
    assert "POLICY_LABELS" not in text, f"{path} names policies without analysis.qevict.labels"
    assert not re.search(r"label\s*=\s*\"(KIVI|H2O|SnapKV|TOVA|StreamingLLM|MiKV|QEvict|Quest)", text), path
