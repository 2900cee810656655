"""HOW weights change: configs and presets, input pipelines, optimizer, sharded step, loop, checkpoints.

Notebook use::

    from triskele.train import make_config, train
    config = make_config("mars-tiny", {"run.steps": 200, "optim.lr": 3e-4})
    summary = train(config, workdir="runs/try")

The names below load on first use, so that importing one module of the package (a domain's data,
the config) does not pull in Orbax and Grain.
"""

import importlib

__all__ = ["PRESETS", "Config", "TrainSummary", "config_from_dict", "make_config", "train"]

_LAZY = {"PRESETS": "triskele.train.config.presets", "Config": "triskele.train.config.schema",
         "config_from_dict": "triskele.train.config.migrations", "make_config": "triskele.train.config.overrides",
         "TrainSummary": "triskele.train.loop", "train": "triskele.train.loop"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'triskele.train' has no attribute {name!r}")
