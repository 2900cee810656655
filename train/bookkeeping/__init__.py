"""What a run keeps about itself beside its checkpoints: logs, plots, profiles, the workdir lock,
the compilation cache and atomic file writes."""
