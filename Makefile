# The two commands of the README:  make book  |  make test
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvbook-installed

.PHONY: book test smoke install unit notebooks clean-cache clean linkcheck bench data lint long long-main default-run agent-traces sharegpt-lengths aic-side-by-side crosscheck

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip==26.3"
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-nodeps.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $(STAMP)

install: $(STAMP)

# Execute every chapter (jupyter-cache: a chapter is re-executed only when its code cells, the modules
# of analysis/ it imports or the data files they read change; the build says which and why) and render
# _build/html, with warnings (and nitpicky references) as errors.
book: $(STAMP)
	$(BIN)/python -m analysis.build

# Fetch and verify every external file of data/registry.yaml (for a machine that will be offline);
# prints where each one is, and fails naming each file that could not be obtained.
data: $(STAMP)
	$(BIN)/python -m analysis.data --fetch-all

# ruff, pinned in requirements.txt and configured in pyproject.toml
lint: $(STAMP)
	$(BIN)/ruff check .

# The book build executes each page once (analysis.execute: in parallel, recording the files each page
# reads); the tests then check that execution (glued values, reads against each page's key, the HTML in
# Chromium) instead of running the chapters again: the chapters' reruns with small parameters are
# `make smoke`, which CI runs after `make test`. Two pytest-xdist workers. OMP_WAIT_POLICY=PASSIVE:
# numba's idle OpenMP threads sleep instead of spinning; with more threads than free cores, spinning
# threads slow chapter 4 down (its smoke run: 289 s -> 127 s on 2 busy cores). tests/conftest.py sets
# it, and one OpenBLAS thread, for pytest's processes.
test: $(STAMP)
	$(BIN)/ruff check .
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m analysis.build
	bash .ci/install-browser.sh  # Debian's chromium + chromium-driver for tests/test_browser.py
	$(BIN)/python -m pytest -q -ra -n 2 --dist worksteal --durations=25 -m "not smoke"

# Every chapter rerun through papermill with its small parameter set (sweeps/smoke_*.yaml), the
# longest first, on two workers: the rerun path readers use. CI runs it after make test.
smoke: $(STAMP)
	$(BIN)/python -m pytest -q -ra -n 2 --dist worksteal --durations=10 -m smoke

# External links of the book (listed in book/links.md) checked by Sphinx's linkcheck builder;
# needs a network (CI has none): run it where one exists; it records each link's date and result in
# book/links_checked.json, which the table of book/links.md shows.
linkcheck: $(STAMP)
	$(BIN)/python -m analysis.build --builder linkcheck; rc=$$?; \
	  $(BIN)/python _ext/links_table.py && exit $$rc

# The fast tier: no chapter executions (notebook), no real model weights (real_weights, tiny random-weight
# models of the same architectures stand in: tests/_tiny_model.py), no Chromium (browser), nothing marked
# slow; make test runs them all.
unit: $(STAMP)
	$(BIN)/python -m pytest -q -ra -n 2 --dist worksteal -m "not notebook and not real_weights and not browser and not slow"

bench: $(STAMP)
	for f in benchmarks/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# Chapter 4's long-context runs: committed artifacts under results/ with provenance; the chapter marks
# them stale, and tests/test_artifacts.py fails, when their code changes (except runs the sweep declares as
# `regenerating`). Whole time: about 5 h on 2 cores (an estimate: 60 main-comparison units of 6-9 min, 2 at a
# time, and the three 8K-32K runs; the 10-document runs took 2 h 10 min, 2026-12-02). Each
# finished (document, model) unit is kept in results/<name>.units/: an interrupted `make long` resumes
# where it stopped (the same command); it prints units done/remaining and the elapsed time as it goes.
# On a Dask cluster: python -m analysis.qevict.longrun_units sweeps/qevict_long.yaml --dask tcp://HOST:8786
long: $(STAMP)
	$(BIN)/python -m analysis.qevict.longrun_units sweeps/qevict_long.yaml --jobs 2
	$(MAKE) default-run

# Chapter 4's default run (six documents, 13 policies, 4 budgets: about 8 minutes of 2 cores, most of a
# clean book build) as the committed artifact results/qevict_default_run/ (analysis.qevict.defaultrun):
# the tables the chapter reads, with provenance. The chapter reads it at its default parameters while it
# is current (same code, parameters, model, frozen settings) and computes the run otherwise, saying why;
# tests/test_artifacts.py fails while it is stale. Part of `make long`. Also chapter 5's measurement of
# its KV policies (results/compose_measured_policies: a smaller chapter-4 run, about 40 s), the same way.
default-run: $(STAMP)
	$(BIN)/python -m analysis.qevict.defaultrun --verbose
	$(BIN)/python -c "from analysis.compose import configure; print(configure.write_default_measurement())"

# The main comparison alone (both architectures, 30 documents in 6 genres; about 4 h on 2 cores, an estimate
# from its units' times): the two runs the claims ledger judges chapter 4's rows on.
long-main: $(STAMP)
	$(BIN)/python -m analysis.qevict.longrun_units sweeps/qevict_long.yaml --jobs 2 \
	  --only qevict_long_main_smollm2 qevict_long_main_gemma

# LMCache's agent traces converted to Mooncake's format (the committed results/lmcache_agent_traces/,
# chapter 2): needs a checkout, or the git directory, of github.com/LMCache/lmcache-agent-trace at the
# commit registered in data/lmcache_agent_traces.csv (each file is checked against its sha256):
#   make agent-traces AGENT_TRACES=/path/to/lmcache-agent-trace
agent-traces: $(STAMP)
	$(BIN)/python -m analysis.derive_traces --source "$(AGENT_TRACES)"

# ShareGPT's per-request lengths for chapter 3's DistServe cell (the committed results/sharegpt_lengths/):
# a seeded sample of the vLLM paper's length file (data registry sharegpt_opt_lengths, fetched and checked
# against its sha256 by analysis.data); the book and CI read the sample, never the file. About a second.
sharegpt-lengths: $(STAMP)
	$(BIN)/python -m analysis.disagg.sharegpt

# Issue 27 item 3: AIConfigurator's own estimator on the silicon runs of chapter 3's validation, in its
# own environment (.aic-venv, requirements-aic.txt); writes results/aic_side_by_side/ (committed, with
# provenance; chapter 3 reads it and never needs aiconfigurator). About 30 min on 2 shared cores.
AIC_VENV := .aic-venv
AIC_ARGS ?= --max-agg 200 --max-disagg 200 --time-budget-s 2700
$(AIC_VENV)/.installed: requirements-aic.txt
	@test -x $(AIC_VENV)/bin/python || $(PYTHON) -m venv $(AIC_VENV)
	$(AIC_VENV)/bin/python -m pip install --quiet -r requirements-aic.txt
	@touch $@

aic-side-by-side: $(AIC_VENV)/.installed
	PYTHONPATH=$(CURDIR) $(AIC_VENV)/bin/python -m analysis.disagg.aic_run $(AIC_ARGS)

# Chapter 4 against a second implementation, NVIDIA's kvpress on transformers + torch (CPU), on the
# chapter's documents (analysis.qevict.crosscheck; under 30 minutes on 2 cores): its own environment,
# .venv-crosscheck (requirements-crosscheck.txt; torch's CPU build where pip reaches it, else PyPI's
# plain wheel of the same release), not part of `make install`. Writes results/qevict_kvpress_crosscheck/.
CROSS := .venv-crosscheck
CROSS_STAMP := $(CROSS)/.kvbook-crosscheck-installed
TORCH_VERSION := 2.13.0

$(CROSS_STAMP): requirements-crosscheck.txt
	@test -x $(CROSS)/bin/python || $(PYTHON) -m venv $(CROSS)
	$(CROSS)/bin/python -m pip install --quiet "torch==$(TORCH_VERSION)+cpu" \
	  || $(CROSS)/bin/python -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(CROSS)/bin/python -m pip install --quiet -r requirements-crosscheck.txt
	@touch $(CROSS_STAMP)

crosscheck: $(STAMP) $(CROSS_STAMP)
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m analysis.qevict.crosscheck

clean-cache:
	rm -rf _build/.jupyter_cache .cache

clean:
	rm -rf _build runs
