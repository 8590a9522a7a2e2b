"""Prediction: what a cell should cost, and how well that held against what it measured.

* the ZeRO accounting of a cell, its model-state bytes and communication
  (``zero_accounting``);
* the FLOPs of one step (``flops``) and its operator calls (``op_calls``), replayed op by op on
  this CPU for the step's compute (``op_replay``);
* the probes of this machine, the GEMM peak (``peaks``, ``gemm_probe``), gloo's collectives
  (``gloo_probe``), AdamW's update (``update_probe``; over DTensors, ``dtensor_update_probe``),
  run copies at once (``at_once``) and cached in the results home (``probe_cache``, as the
  step-time model asks for them: ``machine_probes``);
* network profiles (``network_profiles``; a two-tier cluster's, ``cluster_network``) and the
  step-time model (``step_time``), applied to a record (``record_step_time``);
* the check of the prediction against the measured step (``accuracy``).

It shares the harness's floor: it reads a cell and this machine's cores from the harness's
config, and the harness writes its predictions into each record.
"""
