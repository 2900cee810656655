"""Input pipelines: the global-order loader and one data module per domain."""
