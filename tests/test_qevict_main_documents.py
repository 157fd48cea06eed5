"""Issue 29: the main comparison's 30 documents (sweeps/qevict_long.yaml) with the models' own tokenizers
and the registered Debian packages (fetched from deb.debian.org and verified on first use): every
document loads at its run's length, 5 in each of 6 genres, no two share a 32-token run, none shares
one with the tuning documents (the runs' pre-check), and the same spec gives the same tokens."""
import collections

import pytest

from analysis.qevict import corpora as C
from analysis.qevict import longrun, tuning
from analysis.qevict.longview import MAIN_PREFIX, long_runs
from analysis.qevict.params import PARAMS

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

MAIN = [r for r in long_runs() if r["name"].startswith(MAIN_PREFIX)]


def test_main_runs_have_five_documents_in_each_of_six_genres():
    assert len(MAIN) == 2 and MAIN[0]["documents"] == MAIN[1]["documents"]
    counts = collections.Counter(C.parse_spec(s)[0] for s in MAIN[0]["documents"])
    assert counts == {g: 5 for g in ("code", "docs", "needle", "lit", "encyc", "man")}
    assert len(set(MAIN[0]["documents"])) == 30


def test_the_sources_table_counts_both_runs_documents_by_genre():
    """The evidence page's table of where the documents come from: one row per genre, each distinct
    document of the two main runs (they read the same ones) counted once."""
    from analysis.qevict.chapter import main_document_sources
    t = main_document_sources()
    distinct = {s for r in MAIN for s in r["documents"]}
    assert len(t) == 6 and int(t["documents (count)"].sum()) == len(distinct) == 30


def test_registered_packages_parse():
    assert {"Gen", "Exod", "Job", "Isa", "Ps", "Matt", "Acts", "Rev", "Tob"} <= set(C.bible_books())
    assert len(C.bible_books()) >= 66
    assert len(C.foldoc_entries()) > 10_000
    assert {"tcp.7", "proc.5", "signal.7"} <= set(C.man_pages()) and "ftm.7" not in C.man_pages()


@pytest.mark.slow
@pytest.mark.parametrize("run", MAIN, ids=[r["name"] for r in MAIN])
def test_main_documents_load_and_are_disjoint(run):
    r = longrun.check_run(run)
    tok = _tokenizer(r["model"])
    P, D = int(r["prefill_tokens"]), int(r["decode_tokens"])
    n = P + D + 1  # as the runs' pre-check loads them (longrun_units.precheck)
    kw = dict(prefill_tokens=P, n_needles=r["n_needles"], n_queries=r["n_queries"], seed=r["seed"])
    docs = {s: C.load_document(s, tok, n, **kw) for s in r["documents"]}
    assert all(len(d) == n for d in docs.values())
    toks = {s: d.tokens for s, d in docs.items()}
    specs = list(toks)
    for i, s in enumerate(specs):  # no two evaluation documents share a 32-token run
        tuning.check_disjoint({s: toks[s]}, {o: toks[o] for o in specs[i + 1:]})
    tuned = tuning.load(r.get("tuned_settings", "results/qevict_tuned.json"))
    tP, tD = tuned["prefill_tokens"], tuned["decode_tokens"]
    nn, nq, seed = (PARAMS[k].default for k in ("n_needles", "n_queries", "seed"))
    tdocs = {s: C.load_document(s, tok, tP + tD + 1, prefill_tokens=tP, n_needles=nn, n_queries=nq,
                                seed=seed).tokens for s in tuned["tuning_documents"]}
    tuning.check_disjoint(tdocs, toks)
    for s in ("lit:Job", "encyc:c", "man:proc.5", specs[-1]):  # determinism
        again = C.load_document(s, tok, n, **kw)
        assert again.sha256 == docs[s].sha256


def _tokenizer(model):
    from analysis.qevict.tokenizer import load_tokenizer

    if model == "smollm2":
        from analysis.qevict.gguf_model import gguf_path

        return load_tokenizer(gguf_path())
    from analysis.qevict.gemma_model import gemma_gguf_path

    return load_tokenizer(gemma_gguf_path())
