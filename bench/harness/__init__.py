"""The harness: configs, launching ranks, one rank's work, records, running a list of cells."""
