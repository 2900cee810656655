"""A run's checkpoints: Orbax saving and restoring (`manager`), and what a resume may change (`resume_check`)."""
