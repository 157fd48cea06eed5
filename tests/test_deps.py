"""Per-page execution-cache keys and per-function result-cache keys (analysis.deps, build, cache)."""
import ast
import json
import os
import sys
import traceback
from pathlib import Path

import pytest

from analysis import build, cache, deps

REPO = Path(__file__).resolve().parent.parent
BOOK = REPO / "book"
CHAPTERS = sorted(p.stem for p in BOOK.glob("[0-9][0-9]_*.md"))


def _pages_depending_on(rel: str) -> set[str]:
    out = set()
    for page in build.pages():
        d = deps.chapter_deps(page)
        files = {deps.module_file(m).relative_to(REPO).as_posix() for m in d["modules"]} | set(d["files"])
        if rel in files:
            out.add(page.stem)
    return out


def test_every_chapter_is_a_keyed_page():
    assert set(CHAPTERS) <= {p.stem for p in build.pages()}
    # the front page re-draws chapter 5's decision map (analysis.compose.headline): keyed like a chapter
    assert "intro" in {p.stem for p in build.pages()}
    # chapter 5 marks the borrowed evidence on its own map with the front page's function
    assert _pages_depending_on("analysis/compose/headline.py") == {"intro", "05_where_kv_lives"}


def test_qevict_policies_invalidates_chapters_4_and_5_only():
    assert _pages_depending_on("analysis/qevict/policies.py") == {"04_qevict", "04_qevict_evidence",
                                                                  "05_where_kv_lives",
                                                                  "05_where_kv_lives_evidence", "intro"}


def test_tiering_invalidates_chapters_2_and_5_only():
    pages = {"02_ssd_offload", "02_ssd_offload_evidence", "05_where_kv_lives", "05_where_kv_lives_evidence",
             "intro"}
    assert _pages_depending_on("analysis/tiering/replay.py") == pages


def test_hardware_table_invalidates_the_pages_that_read_it():
    pages = _pages_depending_on("data/hardware.csv")
    assert "04_qevict" not in pages  # chapter 4 runs a language model; it reads no hardware row
    assert {"01_kv_footprint", "02_ssd_offload", "03_disagg", "05_where_kv_lives"} <= pages


def test_benchmark_output_invalidates_no_chapter():
    # written by benchmarks/chapter_resources.py; only the appendix, which shows it, depends on it
    assert _pages_depending_on("data/chapter_resources.csv") == {"appendix_reproduce"}


def test_core_module_invalidates_every_chapter_that_imports_it():
    assert _pages_depending_on("analysis/report.py") >= set(CHAPTERS)
    assert _pages_depending_on("analysis/rerun.py") == set()  # the CLI is not run by any page


def test_relative_and_lazy_imports_are_followed():
    mods = deps.closure(["analysis.kv_params"])
    assert "analysis.specs" in mods  # imported inside a function (choices of the schema)
    assert "analysis.params" in mods and "analysis" in mods  # parent package included
    tree = ast.parse("from ..forward import x\nfrom . import study\nimport analysis.tiering.hitcurve as h")
    assert deps.imports_of(tree, "analysis.disagg.search") == {
        "analysis", "analysis.forward", "analysis.disagg", "analysis.disagg.study", "analysis.tiering",
        "analysis.tiering.hitcurve"}
    assert "analysis.tiering.hitcurve" in deps.imports_of(tree)


def test_file_mentions_and_loader_calls():
    code = ast.parse("from analysis import data as d\nd.published('x')\nd.table(name)\n"
                     "msg = 'see data/models.csv line 3'")
    files = deps.files_read(code)
    assert {"data/published.csv", "data/models.csv", "data/hardware.csv"} <= files  # table(name): all
    assert deps.files_read(ast.parse("x = 'npu_models.csv'")) == set()  # a name inside another name
    prose = '"""Reads data/models.csv."""\ndef f():\n    "see hardware.csv"'
    assert deps.files_read(ast.parse(prose)) == set()  # docstrings read nothing


def _analysis_modules() -> list[str]:
    return sorted(m for m in sys.modules if m == "analysis" or m.startswith("analysis."))


def _modules_loaded_by(code: str) -> set[str]:
    """The modules of analysis that running ``code`` loads, from none loaded: in a forked child of this
    process with every module of analysis dropped from ``sys.modules`` (third-party libraries stay
    imported, so a page's probe costs its own modules, not numpy's and matplotlib's again)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(r)
            for m in _analysis_modules():
                del sys.modules[m]
            exec(code, {})
            os.write(w, json.dumps({"loaded": _analysis_modules()}).encode())
            status = 0
        except BaseException:
            os.write(w, json.dumps({"error": traceback.format_exc()[-2000:]}).encode())
        finally:
            os._exit(status)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        out = fh.read()
    os.waitpid(pid, 0)
    res = json.loads(out)
    assert "error" not in res, res.get("error")
    return set(res["loaded"])


@pytest.mark.slow  # three forked children importing the package
def test_probe_loads_exactly_what_the_code_imports():
    """The fork probe starts from no module of analysis: a bare import loads the package and its own
    imports only; an import of a chapter's module brings what that module imports."""
    base = _modules_loaded_by("import analysis")
    assert base and all(m == "analysis" or m.count(".") == 1 for m in base)
    assert "analysis.disagg.search" not in base
    more = _modules_loaded_by("from analysis.disagg import search")
    assert "analysis.disagg.search" in more and "analysis.forward" in more and base <= more
    with pytest.raises(AssertionError, match="ModuleNotFoundError"):
        _modules_loaded_by("import analysis.no_such_module")


@pytest.mark.slow  # the page's imports in a forked child: about a second each
@pytest.mark.parametrize("page", [p.name for p in build.pages()])
def test_static_closure_covers_the_modules_a_page_loads(page):
    """Run the page's import statements (its schema's among them) from no module of analysis loaded:
    every module of analysis that this loads must be in the page's key."""
    path = BOOK / page
    tree = deps.chapter_tree(path)
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    loaded = _modules_loaded_by(ast.unparse(ast.Module(body=imports, type_ignores=[])))
    static = set(deps.chapter_deps(path)["modules"])
    # the probe loaded the page's modules (the front page only draws a figure)
    assert {"analysis.report", "analysis.tables"} & loaded or path.stem == "intro"
    assert loaded <= static, f"imported but not in the key: {sorted(loaded - static)}"


def test_changed_pages_names_the_changed_files():
    old = {"book/a.md": {"analysis/x.py": "1", "data/h.csv": "1"}, "book/b.md": {"analysis/y.py": "1"}}
    new = {"book/a.md": {"analysis/x.py": "1", "data/h.csv": "2"}, "book/b.md": {"analysis/y.py": "1"},
           "book/c.md": {}}
    assert build.changed_pages(old, new) == {"book/a.md": ["data/h.csv"], "book/c.md": ["no earlier key"]}


def test_invalidate_removes_only_the_records_of_changed_pages(tmp_path, monkeypatch):
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    monkeypatch.setattr(build, "BUILD", tmp_path)
    monkeypatch.setattr(build, "JCACHE", tmp_path / "jc")
    monkeypatch.setattr(build, "KEYS", tmp_path / "keys.json")
    monkeypatch.setattr(build, "OLD_STAMP", tmp_path / "old")
    jc = get_cache(str(tmp_path / "jc"))
    pages = [p for p in build.pages() if p.stem in ("01_kv_footprint", "04_qevict")]
    for i, p in enumerate(pages):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"x = {i}")])
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        jc.cache_notebook_bundle(CacheBundleIn(nb, str(p)), check_validity=False)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("y = 1")])
    jc.cache_notebook_bundle(CacheBundleIn(nb, str(tmp_path / "elsewhere.md")), check_validity=False)
    current = build.plan()
    old = json.loads(json.dumps(current))
    old["book/04_qevict.md"]["analysis/qevict/policies.py"] = "an older version"
    (tmp_path / "keys.json").write_text(json.dumps(old))
    changed = build.invalidate(verbose=False)
    assert set(changed) == {"book/04_qevict.md"}
    left = {Path(r.uri).stem for r in get_cache(str(tmp_path / "jc")).list_cache_records()}
    assert left == {"01_kv_footprint"}  # 04's record (changed key) and the unknown page's are gone
    assert json.loads((tmp_path / "keys.json").read_text()) == current
    assert build.invalidate(verbose=False) == {}  # nothing changed: nothing removed


def test_result_cache_key_follows_the_function_modules(monkeypatch):
    from analysis.qevict import runner

    fn = lambda: runner.run_document  # a compute lambda, as chapters pass them
    assert "analysis.qevict.runner" in deps.function_modules(fn)
    files = deps.fingerprint(deps.module_deps(deps.function_modules(fn)))
    assert "analysis/qevict/policies.py" in files and "analysis/tiering/replay.py" not in files
    k0 = cache.key("ns", {"a": 1}, compute=fn)
    real = deps._file_hash

    def edited(target):
        return lambda p: "edited" if Path(p).as_posix().endswith(target) else real(p)

    monkeypatch.setattr(deps, "_file_hash", edited("analysis/tiering/replay.py"))
    assert cache.key("ns", {"a": 1}, compute=fn) == k0  # another chapter's code: same key
    # the key machinery is in the function's closure, but how results are stored is not what they are
    assert {"analysis.cache", "analysis.deps"} <= set(deps.module_deps(deps.function_modules(fn))["modules"])
    for infra in ("analysis/cache.py", "analysis/deps.py"):
        monkeypatch.setattr(deps, "_file_hash", edited(infra))
        assert cache.key("ns", {"a": 1}, compute=fn) == k0
    monkeypatch.setattr(deps, "_file_hash", edited("analysis/qevict/policies.py"))
    assert cache.key("ns", {"a": 1}, compute=fn) != k0


def test_function_modules_of_notebook_lambdas_and_closures():
    import functools

    from analysis.disagg import study

    ns = {"study": study}
    fn = eval("lambda: study.ratio_sweep()", ns)  # as defined in a chapter (module __main__)
    assert deps.function_modules(fn) == {"analysis.disagg.study"}
    from analysis.tiering.hitcurve import HitCurve
    assert "analysis.tiering.hitcurve" in deps.function_modules(functools.partial(lambda h: h, HitCurve))
    hc = HitCurve
    assert "analysis.tiering.hitcurve" in deps.function_modules(lambda: hc)
    assert cache.code_hash(True, lambda: 1) == cache.package_hash()  # nothing traceable: whole package


def test_committed_results_a_chapter_reads_are_in_its_key():
    """Chapter 4 reads committed long-run artifacts and the frozen tuned settings (results/): they are
    data dependencies of its key (issue 13 keyed the whole cache on results/; here, per chapter)."""
    arts = sorted(p.parent.name for p in (REPO / "results").glob("qevict*/provenance.json"))
    assert arts, "no committed artifact to check with"
    pages = _pages_depending_on(f"results/{arts[0]}/provenance.json")
    assert "04_qevict" in pages and "01_kv_footprint" not in pages and "03_disagg" not in pages
    # chapter 3 reads AIConfigurator's side-by-side artifact by name (issue 27 item 3); chapter 1 reads none
    aic = _pages_depending_on("results/aic_side_by_side/rows.csv")
    assert "03_disagg" in aic and "01_kv_footprint" not in aic
    table = next(p for p in (REPO / "results" / arts[0]).glob("*.csv"))
    assert "04_qevict" in _pages_depending_on(table.relative_to(REPO).as_posix())
    assert "04_qevict" in _pages_depending_on("results/qevict_tuned.json")
    assert "04_qevict" in _pages_depending_on("sweeps/qevict_long.yaml")  # which artifacts it shows


def test_artifact_loader_calls():
    arts = sorted(p.parent.name for p in (REPO / "results").glob("*/provenance.json"))
    code = f"from analysis.artifacts import read_artifact\nread_artifact('{arts[0]}')"
    one = deps.files_read(ast.parse(code))
    assert one and all(f.startswith(f"results/{arts[0]}/") for f in one)
    assert f"results/{arts[0]}/provenance.json" in one
    absent = deps.files_read(ast.parse("from analysis import artifacts as a\na.read_artifact('not_yet')"))
    assert absent == {"results/not_yet/provenance.json"}  # computing it later changes the key
    every = deps.files_read(ast.parse("from analysis.artifacts import list_artifacts\nlist_artifacts()"))
    assert {f"results/{a}/provenance.json" for a in arts} <= every
    assert deps.files_read(ast.parse("read_artifact('x')")) == set()  # not the loader's function


def test_declared_artifact_families_narrow_a_computed_read():
    """A module that reads artifacts by computed names declares their name prefixes (ARTIFACTS_READ):
    chapter 4 no longer re-executes when another chapter's artifact changes; undeclared, every artifact."""
    tree = ast.parse("from analysis.artifacts import read_artifact\nfor n in names:\n    read_artifact(n)\n")
    every = {f.relative_to(REPO).as_posix() for f in deps.artifact_files()}
    assert deps.files_read(tree) == every
    narrowed = deps.files_read(ast.parse('ARTIFACTS_READ = ("qevict_long_",)\n' + ast.unparse(tree)))
    assert narrowed and narrowed < every and all(f.startswith("results/qevict_long_") for f in narrowed)
    for other in ("results/sharegpt_lengths/pairs.csv", "results/aic_side_by_side/provenance.json"):
        assert "04_qevict" not in _pages_depending_on(other)
    assert "04_qevict" in _pages_depending_on("results/qevict_long_main_smollm2/summary.csv")
    assert "04_qevict" in _pages_depending_on("results/qevict_default_run/summary.csv")


def test_keyed_module_lists_cover_the_code_they_key():
    """Every keyed module list of chapter 4's committed artifacts holds the chapter-4 modules that the
    code computing the artifact imports (its static closure; a long run's other model excepted): a
    change there makes the artifact stale.  Chapter 4's default run and chapter 5's measurement share
    the experiment's list."""
    from analysis.compose import fidelity
    from analysis.qevict import crosscheck, defaultrun, experiment, longrun

    assert fidelity.MEASURED_MODULES is experiment.MODULES
    assert set(experiment.MODULES) <= set(defaultrun.MODULES)
    lists = {"experiment.MODULES": (experiment.MODULES, ["analysis.qevict.experiment"]),
             "defaultrun.MODULES": (defaultrun.MODULES, ["analysis.qevict.defaultrun"]),
             "crosscheck.MODULES": (crosscheck.MODULES, ["analysis.qevict.crosscheck"])}
    for m, mod in longrun.MODEL_MODULES.items():
        lists[f"longrun {m}"] = (longrun.MODULES + [mod], ["analysis.qevict.longrun", mod])
    models = set(longrun.MODEL_MODULES.values())
    for name, (mods, roots) in lists.items():
        needed = {m for m in deps.closure(roots) if m.startswith("analysis.qevict.")}
        needed -= models - set(mods)  # a run of one model does not execute the other's module
        assert "analysis.qevict.lmhead" in needed and set(roots) <= needed
        assert needed <= set(mods), f"{name} lacks {sorted(needed - set(mods))}, imported by {roots}"
