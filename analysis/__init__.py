"""The shared package of the book: every number and figure of a chapter is computed here.

Chapters (``book/``) are thin: they set parameters, call this package, plot and glue. Each chapter has
one unit of code: a parameter schema (``params``, registered with :mod:`.params`), the library it
drives, the tables and glued values its cells show (``chapter``) and its figures (``figures``, one
function per figure, named after the figure's label).

=========================  ==========================================================================
chapter                    code
=========================  ==========================================================================
``01_kv_footprint``        :mod:`.kv_params`, :mod:`.kv_chapter`, :mod:`.kv_figures`, on :mod:`.kv`
                           (KV bytes and FLOPs per token of each attention family), :mod:`.specs`
                           and :mod:`.roofline`
``02_ssd_offload``         :mod:`.tiering` (hit curves, tiers, load vs recompute, routing, replay),
                           on :mod:`.traces` and :mod:`.forward`
``03_disagg``              :mod:`.disagg` (devices, deployment modes, plan search, validation, event
                           simulation), on :mod:`.forward`
``04_qevict``              :mod:`.qevict` (numpy GGUF and Gemma models, KV cache, policies, drift
                           metrics, frozen tuned settings, long-run artifacts)
``05_where_kv_lives``      :mod:`.compose` (chapters 1-4 composed into cost per token), calling the
                           public functions of :mod:`.tiering`, :mod:`.disagg` and :mod:`.qevict`
``appendix_reproduce``     :mod:`.data`, :mod:`.report`, :mod:`.resources`
=========================  ==========================================================================

Layers, bottom to top: a module imports only from its own layer and the layers below it, never from
a layer above; ``tests/test_layers.py`` checks this and that the import graph has no cycle, counting
every import (function-local ones too) and every module name written in a string.

1. **data**: :mod:`.data` (external files through ``data/registry.yaml``, verified by sha256; in-repo
   tables with provenance), :mod:`.specs` (typed model and hardware specs).
2. **utilities**, used by every layer above: :mod:`.report` (glue, footers), :mod:`.tables` (every
   table shown to readers: human formatting, interactive when long or wide), :mod:`.plots` (one
   theme), :mod:`.params` (schema registry and validation; imports no module of ``analysis``),
   :mod:`.cache` (on-disk result cache), :mod:`.deps` (what a chapter or cached function depends on:
   the keys of both caches), :mod:`.artifacts` (committed long-run results with provenance),
   :mod:`.claims` (the one verdict engine), :mod:`.resources` (measured build resources),
   :mod:`.tasks` (the one dispatcher of sweeps and long runs: here, spawned processes or Dask). They import
   only the data layer and each other: no core model, no chapter, no tool.
3. **core models**, shared by the chapters: :mod:`.kv`, :mod:`.roofline` (the roofline primitive and
   Mooncake's closed form as the paper writes it), :mod:`.forward` (the one time model of every
   chapter: operators priced by pluggable backends), :mod:`.measured` (a backend reading
   AIConfigurator's measured per-GPU kernel tables, the roofline where they have no entry; no
   chapter uses it yet), :mod:`.traces` (request-trace readers).
4. **chapters**: chapter 1's ``kv_*`` modules, :mod:`.tiering`, :mod:`.disagg`, :mod:`.qevict`; none
   imports another.
5. **composition**: :mod:`.compose` (chapter 5) imports the chapters' public functions.
6. **tools**: :mod:`.build` (``make book``), :mod:`.execute` (the pages run in parallel into the
   execution cache before Sphinx reads them), :mod:`.rerun` (``python -m analysis.rerun``),
   :mod:`.chapters` (which module holds each chapter's schema, by name), :mod:`.glued` (every glued
   value recorded and compared), :mod:`.derive_traces` (LMCache's agent traces, registered in
   ``data/lmcache_agent_traces.csv``, converted to Mooncake's format into a committed artifact);
   ``python -m analysis.data --fetch-all`` (``make data``).

Imports sit at the top of each module; a function-local import is kept only for an optional heavy
dependency (papermill, jupytext, scipy, ...: marked ``# optional heavy dependency``) and in the
modules of :mod:`.qevict` whose source keys committed long-run artifacts.
"""
