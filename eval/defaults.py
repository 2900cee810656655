"""Defaults of the inference commands that their `--help` names, in a module that imports nothing
(no JAX): `triskele.eval.model` re-exports them beside the code that applies them."""

INFERENCE_BATCH_PER_DEVICE = 8
"""predict's default batch: this many records per device on `data x fsdp` (never the training batch)."""
