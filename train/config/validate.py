"""Checks a config against a mesh before anything compiles; each error names the option and a fix."""

from __future__ import annotations

from jax.sharding import Mesh
from triskele.mesh.schedule import check_schedule
from triskele.mesh.spec import divisors
from triskele.train.backbone import vit_config
from triskele.train.config.schema import Config
from triskele.train.domains import get_domain


def validate(config: Config, mesh: Mesh) -> None:
    shape = dict(mesh.shape)
    stages, microbatches = shape["pipeline"], config.pipeline.microbatches if shape["pipeline"] > 1 else 1
    batch_shards = shape["data"] * shape["fsdp"]
    batch, accum = config.data.global_batch, config.optim.grad_accum
    if batch % batch_shards:
        fix = (batch // batch_shards + 1) * batch_shards
        raise ValueError(
            f"data.global_batch={batch} is not divisible by data x fsdp = {batch_shards} on mesh "
            f"'{config.mesh}'; use data.global_batch={fix} or a mesh whose data x fsdp divides {batch}"
        )
    if batch % (accum * batch_shards):
        raise ValueError(
            f"optim.grad_accum={accum} splits data.global_batch={batch} into microbatches of {batch / accum:g}, "
            f"which must be divisible by data x fsdp = {batch_shards}; use grad_accum in "
            f"{[k for k in divisors(batch) if (batch // k) % batch_shards == 0]}"
        )
    unit = accum * microbatches * batch_shards
    if batch % unit:
        raise ValueError(
            f"data.global_batch={batch} is not divisible by pipeline.microbatches x data x fsdp"
            f"{' x optim.grad_accum' if accum > 1 else ''} = {unit} on mesh '{config.mesh}'; "
            f"use data.global_batch={(batch // unit + 1) * unit} or fewer pipeline.microbatches"
        )
    if config.model.frames > 1 and not get_domain(config.domain).clips:
        raise ValueError(f"model.frames={config.model.frames}: {config.domain} models take single images, not clips; "
                         "use model.frames=1")
    vit = vit_config(config)
    if vit.heads % shape["tensor"]:
        raise ValueError(
            f"model.size={config.model.size!r} has {vit.heads} heads, not divisible by mesh tensor={shape['tensor']}; "
            f"use tensor in {divisors(vit.heads)}"
        )
    if stages > 1:
        check_schedule(vit.depth, stages, config.pipeline.repeats, microbatches, schedule=config.pipeline.schedule)
    elif vit.depth % config.pipeline.repeats:
        raise ValueError(f"model depth {vit.depth} is not divisible by pipeline.repeats={config.pipeline.repeats}; "
                         f"use pipeline.repeats in {divisors(vit.depth)}")
