"""One schema per chapter, each parameter defined once.

* A chapter's ``parameters`` cell (literal, as papermill needs it) sets exactly its schema's
  parameters with exactly the schema's defaults (the test fails when one default differs).
* No module of ``analysis`` carries a third copy of a default (``p.get("name", default)``).
* Schema modules import no computation module; the names they allow are the ones the computation
  modules implement.
* Registration goes downward: :mod:`analysis.params` imports no module of ``analysis``; the schema
  modules register themselves; the typed configuration holds every parameter exactly once.
"""
from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import chapters, params

REPO = Path(__file__).resolve().parent.parent
BOOK_CHAPTERS = [s for s in chapters.CHAPTERS if (REPO / "book" / f"{s}.md").exists()]


def parameters_cell(path: Path) -> str:
    """The source of the MyST notebook's code cell tagged ``parameters`` (read as jupytext writes it:
    a ``{code-cell}`` fence whose ``:tags:`` option holds ``parameters``)."""
    cells = [m.group(2) for m in re.finditer(r"^```\{code-cell\}[^\n]*\n((?::[^\n]*\n)*)\n?(.*?)^```",
                                             path.read_text(encoding="utf-8"), re.M | re.S)
             if re.search(r"^:tags:.*\bparameters\b", m.group(1), re.M)]
    assert len(cells) == 1, f"{path.name}: {len(cells)} cells tagged 'parameters'"
    return cells[0]


def cell_values(source: str) -> dict:
    """``{name: value}`` of a parameters cell; every statement must assign a literal to one name."""
    out = {}
    for node in ast.parse(source).body:
        ok = isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        assert ok, f"not a 'name = literal' assignment: {ast.unparse(node)}"
        name = node.targets[0].id
        assert name not in out, f"{name} is set twice"
        out[name] = ast.literal_eval(node.value)
    return out


def disagreements(source: str, schema) -> list[str]:
    """What differs between a parameters cell and a schema: names set but not declared, declared but
    not set, and defaults (compared as values and as types: 1 and 1.0 differ)."""
    values = cell_values(source)
    errs = [f"{k}: set by the cell, not in the schema" for k in values if k not in schema]
    errs += [f"{k}: in the schema, not set by the cell" for k in schema if k not in values]
    for k in values.keys() & set(schema):
        d = schema[k].default
        if values[k] != d or type(values[k]) is not type(d) or repr(values[k]) != repr(d):
            errs.append(f"{k}: cell {values[k]!r}, schema default {d!r}")
    return errs


@pytest.mark.parametrize("stem", BOOK_CHAPTERS)
def test_parameters_cell_sets_exactly_the_schema_defaults(stem):
    src = parameters_cell(REPO / "book" / f"{stem}.md")
    assert disagreements(src, chapters.schema(stem)) == []


def test_fixture_chapter_agrees_with_its_schema(fixture_chapter):
    assert disagreements(parameters_cell(fixture_chapter), chapters.schema("99_fixture")) == []


def test_a_changed_default_a_missing_or_an_extra_parameter_is_reported():
    sch = chapters.schema("02_ssd_offload")
    src = parameters_cell(REPO / "book" / "02_ssd_offload.md")
    assert disagreements(src, sch) == []
    assert disagreements(src.replace("\ntp = 8\n", "\ntp = 4\n"), sch) == ["tp: cell 4, schema default 8"]
    schema_changed = {**sch, "tp": dataclasses.replace(sch["tp"], default=4)}
    assert disagreements(src, schema_changed) == ["tp: cell 8, schema default 4"]
    assert disagreements(src.replace("\npue = 1.3\n", "\npue = 1.30001\n"), sch) == \
        ["pue: cell 1.30001, schema default 1.3"]
    int_for_float = src.replace("\ncompute_eff = 0.5\n", "\ncompute_eff = 1\n")
    assert disagreements(int_for_float, sch) == ["compute_eff: cell 1, schema default 0.5"]
    assert disagreements(src.replace("\ntp = 8\n", "\n"), sch) == ["tp: in the schema, not set by the cell"]
    assert disagreements(src + "\ntpp = 8\n", sch) == ["tpp: set by the cell, not in the schema"]
    with pytest.raises(AssertionError, match="not a 'name = literal'"):
        cell_values(src + "\nfrom math import pi\n")


# ------------------------------------------------------------------------------ no third copy

# .get(name, default) calls on a *different* mapping whose key happens to share a parameter's name
NOT_PARAMETERS = {
    ("analysis/disagg/chapter.py", "batch"),  # a plan's batch size
    ("analysis/disagg/figures.py", "batch"),  # a plan unit's batch size
    ("analysis/disagg/search.py", "tp"),  # a plan unit's tensor-parallel degree (grid_edges)
    ("analysis/compose/chapter.py", "batch"),  # a decode plan's batch size (absent when infeasible)
    ("analysis/qevict/tuning.py", "documents"),  # the tuning cache's inputs
    ("analysis/measured.py", "kv_dtype"),  # an operator's shape (forward.Op), bf16 unless the op says
    # a long run's row, every knob already set from the schema's defaults (check_run); the module is
    # keyed by the committed long-run artifacts, so it is not edited
    ("analysis/qevict/longrun.py", "tuned_settings"),
}


def test_no_module_repeats_a_default_of_a_schema_parameter():
    names = set().union(*(set(chapters.schema(s)) for s in chapters.CHAPTERS))
    found = []
    for f in sorted((REPO / "analysis").rglob("*.py")):
        rel = f.relative_to(REPO).as_posix()
        for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr in ("get", "setdefault", "pop") and len(n.args) + len(n.keywords) >= 2
                    and n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value in names
                    and (rel, n.args[0].value) not in NOT_PARAMETERS):
                found.append(f"{rel}:{n.lineno}: {ast.unparse(n)}")
    assert found == []


# ------------------------------------------------------------------------------ layering

SCHEMA_FILES = ["analysis/kv_params.py"] + [f"analysis/{s}/params.py" for s in ("tiering", "disagg",
                                                                                  "qevict", "compose")]
DATA_LAYER = {"analysis.params", "analysis.specs", "analysis.data"}


def _analysis_imports(path: Path) -> set[str]:
    rel = path.relative_to(REPO).with_suffix("")
    package = ".".join(rel.parts[:-1])
    out = set()
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name.split(".")[0] == "analysis"}
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = package.split(".")[: len(package.split(".")) - n.level + 1]
                mod = ".".join(base + ([n.module] if n.module else []))
            else:
                mod = n.module or ""
            if mod.split(".")[0] == "analysis":
                out |= {mod} if n.module else {f"{mod}.{a.name}" for a in n.names}
    return out


@pytest.mark.parametrize("path", SCHEMA_FILES)
def test_schema_modules_import_only_the_data_layer(path):
    """A schema lists what it allows from data files (``analysis.specs``, ``analysis.data``) or as
    literals checked below, never by importing a computation module (anywhere in the file)."""
    assert _analysis_imports(REPO / path) <= DATA_LAYER


def test_base_layer_imports_no_analysis_module():
    assert _analysis_imports(REPO / "analysis" / "params.py") == set()
    assert _analysis_imports(REPO / "analysis" / "chapters.py") == {"analysis.params"}


def test_allowed_names_are_those_the_computation_modules_implement():
    from analysis.compose import params as cp
    from analysis.compose import pipeline
    from analysis.qevict import corpora, policies
    from analysis.qevict import params as qp
    from analysis.tiering import admission, cluster, tiers
    from analysis.tiering import params as tp
    from analysis.tiering import policies as tpol

    assert tp.CONFIGS == tuple(tiers.CONFIGS) and tp.DATA_PATHS == tuple(tiers.DATA_PATHS)
    assert tp.ROUTING == tuple(cluster.ROUTING) and tp.EVICTION_POLICIES == tuple(tpol.POLICIES)
    assert tp.EVICTION == tuple(admission.EVICTION) and tp.ADMISSION == tuple(admission.ADMISSION)
    assert cp.LAYOUTS == tuple(pipeline.LAYOUTS) and cp.MODES == tuple(pipeline.MODES)
    assert set(cp.SCHEMA["kv_policies"].allowed()) <= set(policies.POLICIES) - {"full"}
    assert qp.POLICIES == tuple(policies.POLICIES) and qp.GENRES == tuple(corpora.GENRES)


def test_importing_the_registry_imports_no_chapter():
    code = ("import sys, analysis.params, analysis.chapters; "
            "print(sorted(m for m in sys.modules if m.startswith('analysis.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['analysis.chapters', 'analysis.params']"


def test_chapters_register_themselves_and_the_registry_finds_them_by_name(monkeypatch):
    code = ("from analysis import params; import analysis.qevict.params as q; "
            "print(params.registered(), params.schema('book/04_qevict.md') is q.SCHEMA)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['04_qevict'] True"
    code = "from analysis import params; params.schema('04_qevict')"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode != 0 and "analysis.chapters.schema('04_qevict')" in out.stderr
    with pytest.raises(params.ParameterError, match="chapters: 01_kv_footprint"):
        chapters.schema("07_nope")


# ------------------------------------------------------------------------------ typed configurations

@pytest.mark.parametrize("stem", list(chapters.CHAPTERS))
def test_configuration_holds_every_parameter_once_at_its_value(stem):
    sch = chapters.schema(stem)
    c = sch.config()
    leaves = {}
    for f in dataclasses.fields(c):
        v = getattr(c, f.name)
        if dataclasses.is_dataclass(v):
            leaves.update({g.name: getattr(v, g.name) for g in dataclasses.fields(v)})
        else:
            leaves[f.name] = v
    assert leaves == sch.validate(sch.defaults())
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(c, dataclasses.fields(c)[0].name, None)


@dataclasses.dataclass(frozen=True)
class A:
    x: int


@dataclasses.dataclass(frozen=True)
class Both:
    a: A
    x: int


def test_a_configuration_that_misses_or_repeats_a_parameter_is_refused():
    ps = {"x": params.Param(1, "int"), "y": params.Param(2, "int")}
    with pytest.raises(TypeError, match=r"missing \['y'\]"):
        params.Schema("t", ps, config=A)
    with pytest.raises(TypeError, match=r"twice \['x'\]"):
        params.Schema("t", {"x": ps["x"]}, config=Both)


def test_qevict_configuration_reaches_the_engine():
    from analysis.qevict import experiment
    from analysis.qevict import params as qp

    d = qp.SCHEMA.defaults()
    c = qp.SCHEMA.config(d)
    assert experiment.policy_config(c) == experiment.policy_config(d) == experiment.policy_config(c.policies)
    assert experiment.policy_config({**d, "head_dim": 128}).head_dim == 128
    for k, v in dict(window_tokens=64, group_size=16, qevict_bits=4, full_share=0.3, score_decay=0.9,
                     sink_windows=2, snap_obs_tokens=16, snap_kernel=5).items():
        changed = qp.SCHEMA.config({**d, k: v, "budgets": [0.35, 0.5]})
        assert experiment.policy_config(changed) != experiment.policy_config(c), k
    with pytest.raises(TypeError, match="QEvictConfig"):
        experiment.run_experiment(d)
    with pytest.raises(params.ParameterError, match="multiple of window_tokens"):
        qp.SCHEMA.config({"prefill_tokens": 1000})  # the cross-parameter checks run on every config


def test_extra_chapter_with_a_plain_dict_of_params(tmp_path, monkeypatch):
    """A notebook of one's own (``KVBOOK_EXTRA_CHAPTERS="stem=module:attr"``) may give a plain mapping
    of :class:`~analysis.params.Param`: :mod:`analysis.chapters` wraps and registers it."""
    (tmp_path / "my_schema_b.py").write_text("from analysis.params import Param\n"
                                             "KNOBS = {'n': Param(3, 'int', 'a count', min=1)}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("KVBOOK_EXTRA_CHAPTERS", "98_mine=my_schema_b:KNOBS")
    sch = chapters.schema("notebooks/98_mine.ipynb")
    assert isinstance(sch, params.Schema) and sch.defaults() == {"n": 3}
    assert params.schema("98_mine") is sch and sch.check({"n": 4}) == {"n": 4}
    with pytest.raises(params.ParameterError, match="below the minimum"):
        sch.config({"n": 0})


# ------------------------------------------------------------------------------ evidence pages
EVIDENCE_PAGES = sorted((REPO / "book").glob(f"[0-9][0-9]_*{params.EVIDENCE_SUFFIX}.md"))


def test_an_evidence_page_has_its_chapters_schema():
    assert params.chapter_stem("book/02_ssd_offload_evidence.md") == "02_ssd_offload"
    assert params.chapter_stem("02_ssd_offload.md") == "02_ssd_offload"
    assert chapters.schema_module("book/04_qevict_evidence.md") == chapters.CHAPTERS["04_qevict"]
    assert chapters.schema("03_disagg_evidence") is chapters.schema("03_disagg")


def test_check_with_defaults_fills_only_what_is_missing():
    sch = chapters.schema("01_kv_footprint")
    ns = {"dtype": "fp8"}
    out = sch.check(ns, defaults=True)
    assert out["dtype"] == "fp8" and ns["dtype"] == "fp8"
    assert {k: v for k, v in out.items() if k != "dtype"} == \
        {k: v for k, v in sch.validate(sch.defaults()).items() if k != "dtype"}
    with pytest.raises(params.ParameterError, match="lacks"):
        sch.check({"dtype": "fp8"})  # a chapter's own cell must set every parameter


@pytest.mark.parametrize("page", EVIDENCE_PAGES, ids=lambda p: p.stem)
def test_an_evidence_pages_parameters_cell_sets_nothing(page):
    """The chapter's parameters cell is the one place its defaults are written: the evidence page's cell
    (where papermill injects a rerun's values) assigns no name, and the page takes the rest from the
    schema (``SCHEMA.check(globals(), defaults=True)``)."""
    src = parameters_cell(page)
    assert cell_values(src) == {}, f"{page.name}: its parameters cell sets {sorted(cell_values(src))}"
    assert "defaults=True" in page.read_text(encoding="utf-8")
    assert (REPO / "book" / f"{params.chapter_stem(page.name)}.md").exists()
