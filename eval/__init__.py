"""HOW GOOD it is: domain metrics, evaluating checkpoints, reports, prediction."""
