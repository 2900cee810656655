"""WHAT is computed: pure Flax NNX modules; one ViT backbone, one head per domain."""

from triskele.models.vit import VIT_SIZES, ViT, ViTClassifier, ViTConfig

__all__ = ["VIT_SIZES", "ViT", "ViTClassifier", "ViTConfig"]
