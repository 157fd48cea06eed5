"""Chapter 5: where should the KV cache live? The other chapters composed into one cost per token.

* :mod:`.fidelity`  KV policies (on-device, cold-tier and recall bytes; fidelity) measured by chapter 4;
* :mod:`.pipeline`  model x workload x KV policy x tier layout x deployment mode -> cost per
  million tokens and SLOs, from chapters 1-4's public functions (adapters stated there);
* :mod:`.decide`    the decision map, sensitivities, frontier lines and the Kimi Linear decode check;
* :mod:`.figures`   the chapter's figures; :mod:`.params` its papermill schema.
"""
