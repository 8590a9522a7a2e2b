"""Studies: what a user asks of the harness (max trainable size, the sharding claim, ...)."""
