"""What a domain model provides to the rest of triskele: the training step, inference and the cost
formulas. Every domain's model (`models/<domain>.py`) satisfies `DomainModel`; one evaluated over
fixed-size records also `RecordStats`."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import jax
from triskele.mesh.shape import ModelShape

Batch = dict[str, jax.Array]


@runtime_checkable
class DomainModel(Protocol):
    normalisation: str
    """How the model normalises its [0, 1] input pixels: a key of `triskele.models.preprocess.NORMALISATIONS`."""

    def loss_terms(self, batch: Batch) -> tuple[jax.Array, jax.Array]:
        """(summed loss, summed weight) of a batch; padded rows (`valid` 0) weigh nothing. The step
        divides the global sums, so the loss is the same on any mesh and any grad_accum."""
        ...

    def infer(self, images: jax.Array) -> dict[str, jax.Array]:
        """What inference returns for [0, 1] pixels, by output name (what predict and export use)."""
        ...

    def cost_shape(self) -> ModelShape:
        """The model's sizes for the analytic FLOP, memory and communication formulas."""
        ...


@runtime_checkable
class RecordStats(Protocol):
    """A model that `triskele.train.evaluator.BatchEvaluator` evaluates over fixed-size records
    (deepfake, merch; mars evaluates whole frames by sliding windows instead)."""

    def eval_stats(self, batch: Batch) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
        """(sums over the batch, per-record values): evaluation adds the sums over every batch and
        concatenates the per-record values in record order; the domain's metrics read both."""
        ...
