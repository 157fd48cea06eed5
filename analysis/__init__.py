"""The shared package of the book: every number and figure of a chapter is computed here.

Chapters (``book/``) are thin: they set parameters, call this package, plot and glue. Which code
each chapter runs:

=========================  ==========================================================================
chapter                    code
=========================  ==========================================================================
``01_kv_footprint``        :mod:`.kv` (KV bytes and FLOPs per token, each attention family),
                           :mod:`.specs` (models and hardware from ``data/``), :mod:`.roofline`;
                           schema :mod:`.kv_params`
``02_ssd_offload``         :mod:`.tiering` (hit curves, tiers, load vs recompute, replay), on
                           :mod:`.traces` and :mod:`.forward`
``03_disagg``              :mod:`.disagg` (devices, deployment modes, plan search, validation), on
                           :mod:`.forward`
``04_qevict``              :mod:`.qevict` (numpy GGUF model, KV cache, policies, drift metrics)
``05_where_kv_lives``      :mod:`.compose` (chapters 1-4 composed into cost per token), calling the
                           public functions of :mod:`.tiering`, :mod:`.disagg` and :mod:`.qevict`;
                           timed by :mod:`.forward`
``appendix_reproduce``     :mod:`.data`, :mod:`.report` (files, versions, measured resources)
=========================  ==========================================================================

Layers (a module imports only from its own layer or the layers above it):

1. **data and specs**: :mod:`.data` (external files through ``data/registry.yaml``, verified by
   sha256; in-repo tables with provenance), :mod:`.specs` (typed model and hardware specs).
2. **core models**, shared by the chapters: :mod:`.kv`, :mod:`.roofline` (the roofline primitive and
   Mooncake's Eq. 2 as the paper writes it), :mod:`.forward` (the one time model: every operator and
   forward pass of chapters 2, 3 and 5, priced through pluggable backends, the roofline by default),
   :mod:`.traces` (request-trace readers).
3. **chapter subpackages**: :mod:`.tiering`, :mod:`.disagg`, :mod:`.qevict`; none imports another.
4. **composition**: :mod:`.compose` (chapter 5) imports the three subpackages' public functions.

Beside the layers, used by all: :mod:`.report` (glue, verdicts, footers), :mod:`.plots` (one theme),
:mod:`.params` (papermill schemas and validation), :mod:`.cache` (on-disk result cache) and
:mod:`.deps` (what each chapter and cached function depends on: the keys of both caches). Tools:
:mod:`.build` (``make book``), :mod:`.rerun` (``python -m analysis.rerun``), ``python -m
analysis.data --fetch-all`` (``make data``).
"""
