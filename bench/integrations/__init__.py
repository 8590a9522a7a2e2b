"""Our ZeRO inside other training frameworks. Each module imports its framework (an optional
extra) only when it is itself imported: ``shardbench.integrations.lightning``."""
