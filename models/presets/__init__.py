"""Size presets of the built-in workloads, and their parameter counts from shape alone.

One module per workload (``PRESETS``, ``LADDER``, ``param_count(preset)``), importing nothing
from torch or the model libraries: ``shardbench list`` and the size ladder count parameters
without paying seconds of imports, or a model build, per workload. The workload classes in
``models/`` take their presets from here; ``shardbench.models.registry.preset_param_counts`` reads them.
"""
