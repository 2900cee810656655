"""Gradient accumulation: the data-parallel all-reduce runs once per step, counted in the compiled
HLO, and the accumulated gradients stay those of the whole batch where a pipeline runs inside."""

import jax
import triskele.train.step as step_module
from conftest import assert_trees_close, relative_error
from trainutil import mesh_of, small_config
from triskele.mesh import host_to_global
from triskele.train.config.overrides import make_config
from triskele.train.data.pipeline import TrainStepLoader
from triskele.train.run import prepare
from triskele.train.tools.step_analysis import compile_train_step, measure

# The setting: mars-tiny, 32 px, depth 2, data=8 (1.23 MB all-reduced per step at grad_accum 1).
TINY = ["model.image_size=32", "model.depth=2", "data.global_batch=32", "mesh=data=8"]


def all_reduce_bytes(grad_accum: int) -> float:
    parts = prepare(make_config("mars-tiny", [*TINY, f"optim.grad_accum={grad_accum}"]))
    compiled, _ = compile_train_step(parts)
    return measure(compiled, parts.mesh).program.collective_bytes["all-reduce"]


def test_accumulation_all_reduces_the_gradients_once_per_step(devices, monkeypatch):
    once = all_reduce_bytes(1)
    assert once > 1e6, "the gradients of mars-tiny are about 0.6 MB: a data=8 ring sends ~1.2 MB"
    # Measured: 1.000x (the loss and weight sums ride with the gradients); per microbatch it is 4.0x.
    assert all_reduce_bytes(4) < 1.3 * once

    # Positive control: the same scan without the shard_map (the code before) reduces every microbatch.
    monkeypatch.setattr(step_module, "summed_gradients",
                        lambda graphdef, params, batch, k: step_module._accumulated(graphdef, params, batch, k))
    assert all_reduce_bytes(4) > 1.3 * once


def test_accumulation_through_a_pipeline_equals_one_big_step(devices):
    mesh = mesh_of("pipeline=2,data=4")
    config = small_config(**{"model.depth": 2})
    parts = prepare(config, mesh)
    params = parts.init_state().params
    batch = host_to_global(TrainStepLoader(parts.domain.open_split(config, "train"), 32, 0, (0, 32))(0), mesh, 32)
    with jax.set_mesh(mesh):
        gradients = jax.jit(step_module.summed_gradients, static_argnums=(0, 3))
        whole_loss, whole_weight, whole = gradients(parts.graphdef, params, batch, 1)
        accum_loss, accum_weight, accum = gradients(parts.graphdef, params, batch, 2)
    assert relative_error(accum_loss, whole_loss) < 1e-5 and relative_error(accum_weight, whole_weight) < 1e-5
    assert_trees_close(jax.device_get(accum), jax.device_get(whole), 1e-5)

