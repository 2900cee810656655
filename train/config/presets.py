"""The presets: `<domain>-<size>` and `<domain>-<variant>-<size>` for every registered domain."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from triskele.train.domains import domains

# Per size: model fields and the run's scale. `tiny` trains on a 2-core CPU in minutes.
_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"model.size": "tiny", "model.patch": 8, "model.image_size": 64, "optim.lr": 2e-3,
             "run.eval_every": 300},
    "s16": {"model.size": "S", "model.patch": 16, "model.image_size": 224, "data.global_batch": 256,
            "optim.lr": 5e-4, "optim.warmup_steps": 1000, "run.steps": 20000, "checkpoint.every": 1000,
            "run.eval_every": 1000, "data.train_size": 100_000, "data.eval_size": 5000},
    "b16": {"model.size": "B", "model.patch": 16, "model.image_size": 224, "data.global_batch": 512,
            "optim.lr": 3e-4, "optim.warmup_steps": 2000, "run.steps": 30000, "checkpoint.every": 1000,
            "run.eval_every": 1000, "data.train_size": 200_000, "data.eval_size": 5000, "model.remat": "full"},
    "l16": {"model.size": "L", "model.patch": 16, "model.image_size": 224, "data.global_batch": 1024,
            "optim.lr": 2e-4, "optim.warmup_steps": 3000, "run.steps": 50000, "checkpoint.every": 1000,
            "run.eval_every": 1000, "data.train_size": 400_000, "data.eval_size": 5000, "model.remat": "full"},
}


class _Presets(Mapping[str, dict[str, Any]]):
    """`<domain>-<size>` for every registered domain and size: the domain's spec's preset, then the
    size's; and `<domain>-<variant>-<size>` for each of its variants, the variant's values last."""

    def _all(self) -> dict[str, dict[str, Any]]:
        presets = {}
        for name, domain in domains().items():
            for variant, values_for in {"": lambda size: {}, **domain.variants}.items():
                for size, values in _SIZES.items():
                    presets[f"{name}-{variant + '-' if variant else ''}{size}"] = {
                        "domain": name, **domain.preset, **values, **values_for(size)}
        return presets

    def __getitem__(self, name: str) -> dict[str, Any]:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


PRESETS: Mapping[str, dict[str, Any]] = _Presets()
DEFAULT_PRESET = "mars-tiny"
