"""HOW GOOD it is: domain metrics, evaluating checkpoints on any mesh, reports, prediction, export.

The names below load on first use: the command line parses without JAX, and `load_exported`
needs only JAX (a serving process never imports the models).
"""

__all__ = ["evaluate_checkpoint", "export_model", "load_exported", "predict", "predict_iter"]

_LAZY = {"evaluate_checkpoint": "triskele.eval.report", "predict": "triskele.eval.prediction",
         "predict_iter": "triskele.eval.prediction", "export_model": "triskele.eval.export",
         "load_exported": "triskele.eval.load_export"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'triskele.eval' has no attribute {name!r}")
