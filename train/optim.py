"""AdamW with linear warm-up then cosine decay, global-norm clipping, and no decay on norms,
biases and embeddings (only parameters named `kernel` decay)."""

from __future__ import annotations

from typing import Any

import jax
import optax
from triskele.train.config.schema import OptimConfig


def learning_rate_schedule(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0 if warmup else cfg.lr,
        peak_value=cfg.lr,
        warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1),
        end_value=cfg.lr * cfg.end_lr_fraction,
    )


def weight_decay_mask(params: Any) -> Any:
    """True for weight matrices (leaves named `kernel`), False for norms, biases, embeddings."""

    def decays(path, _leaf) -> bool:
        last = path[-1]
        return getattr(last, "key", getattr(last, "name", None)) == "kernel"

    return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(cfg: OptimConfig, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    schedule = learning_rate_schedule(cfg, total_steps)
    tx = optax.chain(
        optax.clip_by_global_norm(cfg.clip_norm),
        optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=weight_decay_mask),
    )
    return tx, schedule
