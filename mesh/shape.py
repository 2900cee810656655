"""`ModelShape`: the sizes a model's cost depends on, as its `cost_shape()` reports them.

A plain dataclass, apart from the formulas that read it (`triskele.mesh.perf.formulas`), so that
the models can describe themselves without importing the performance model.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the cost of a ViT-based model depends on."""

    width: int
    depth: int
    mlp_dim: int
    heads: int
    patches: int
    """Patch tokens per image."""
    patch_dim: int
    """Pixels x channels per patch."""
    class_token: bool = True
    images_per_record: int = 1
    """Frames per record (video models run the backbone on each)."""
    head_flops: float = 0.0
    """Forward FLOPs per record of the domain head's layers that every tensor device runs whole."""
    head_split_flops: float = 0.0
    """Forward FLOPs per record of the domain head's layers split over `tensor` (e.g. by `mlp`)."""
    head_flops_without_input_grad: float = 0.0
    """The part of `head_flops` whose input needs no gradient (layers on raw pixels)."""
    head_split_inputs: int = 0
    """Elements per record entering the head's tensor-split layers (their gradient is all-reduced)."""
    head_split_outputs: int = 0
    """Elements per record leaving them (all-gathered for the layers that run whole)."""
    vocab: int = 0
    """A language model's vocabulary (its output layer is in `head_split_flops`); 0 for vision."""

    @property
    def tokens(self) -> int:
        return self.patches + int(self.class_token)
