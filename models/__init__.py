"""WHAT is computed: pure Flax NNX modules; one ViT backbone, one head per domain.

The names below load on first use, so that importing one module of the package (the JAX-free
`preprocess` helpers a data reader uses, say) does not pull in Flax and the ViT.
"""

import importlib

__all__ = ["VIT_SIZES", "ViT", "ViTClassifier", "ViTConfig"]

_LAZY = {"VIT_SIZES": "triskele.models.vit", "ViT": "triskele.models.vit", "ViTClassifier": "triskele.models.vit",
         "ViTConfig": "triskele.models.vit"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'triskele.models' has no attribute {name!r}")
