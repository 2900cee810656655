"""HOW weights change: configs and presets, input pipelines, optimizer, sharded step, loop, checkpoints.

Notebook use::

    from triskele.train import make_config, train
    config = make_config("mars-tiny", {"run.steps": 200, "optim.lr": 3e-4})
    summary = train(config, workdir="runs/try")
"""

from triskele.train.config import PRESETS, Config, config_from_dict, make_config
from triskele.train.loop import TrainSummary, train

__all__ = ["PRESETS", "Config", "TrainSummary", "config_from_dict", "make_config", "train"]
