"""Chapter 3: a roofline simulator of disaggregated LLM serving (prefill / decode / attention / FFN)
with a vectorised parallelism search and validation against measured serving runs.

* per-layer operator costs live in :mod:`analysis.forward` (the core layer, shared with chapter 2);
* :mod:`.devices`: GPUs (data/hardware.csv, with scale-up domain and NIC) and custom NPU design points
  (data/npu_design_points.csv) and their price models;
* :mod:`.search`: deployment modes (C, PD, AF, 3-way, PDAF), workloads (prefix hits, length
  distributions) and the best-plan search under SLOs (rate-matched or whole instances, top-k);
* :mod:`.des`: discrete-event simulation of a plan over a trace (simpy), p90 TTFT/TPOT, re-ranking;
* :mod:`.validate`: prediction of measured TTFT/TPOT (AIConfigurator silicon runs), calibration split;
* :mod:`.aic_run`: AIConfigurator's own estimator on the silicon runs (``make aic-side-by-side``, its
  own environment ``.aic-venv``), committed as ``results/aic_side_by_side``; :mod:`.side_by_side`: its
  predictions next to the simulator's and the measured runs (reads the artifact only);
* :mod:`.production`: validation cells against public production figures (StepFun Step-3);
* :mod:`.verdicts`: the chapter's verdict rules, decided in one place;
* :mod:`.study`: the chapter's experiments (sweeps, ablation, Pareto fronts, Mooncake cells);
* :mod:`.params`: the chapter's papermill schema.
"""
