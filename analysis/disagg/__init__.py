"""Chapter 3: a roofline simulator of disaggregated LLM serving (prefill / decode / attention / FFN)
with a vectorised parallelism search and validation against measured serving runs.

* per-layer operator costs live in :mod:`analysis.forward` (the core layer, shared with chapter 2);
* :mod:`.devices`: GPUs (data/hardware.csv) and custom NPU design points (data/npu_design_points.csv);
* :mod:`.search`: deployment modes (C, PD, AF, 3-way, PDAF) and the best-plan search under SLOs;
* :mod:`.validate`: prediction of measured TTFT/TPOT (AIConfigurator silicon runs), calibration split;
* :mod:`.workloads`: the input/output ratio sweep and Mooncake-trace lengths;
* :mod:`.params`: the chapter's papermill schema.
"""
