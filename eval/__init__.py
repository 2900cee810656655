"""HOW GOOD it is: domain metrics, evaluating checkpoints on any mesh, reports, prediction."""

from triskele.eval.domains import metrics_fn
from triskele.eval.evaluate import evaluate_checkpoint, predict

__all__ = ["evaluate_checkpoint", "metrics_fn", "predict"]
