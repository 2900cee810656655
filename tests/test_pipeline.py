import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_trees_close, relative_error
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from trainutil import final_params, mesh_of, run, small_config, step_records
from triskele.mesh import host_to_global, make_mesh, tree_shardings
from triskele.mesh.logical import bytes_per_device
from triskele.mesh.perf.hlo_counts import Collective, collectives, program_cost
from triskele.mesh.perf.planner import evaluate
from triskele.mesh.pipeline import bubble_fraction, check_schedule
from triskele.mesh.spec import MeshSpec
from triskele.models import ViT, ViTConfig
from triskele.train import train
from triskele.train.cli import main as train_main
from triskele.train.data.pipeline import TrainStepLoader
from triskele.train.run import prepare
from triskele.train.step import batch_shardings_of, make_train_step
from triskele.train.tools.plan_inputs import plan_inputs
from triskele.train.tools.step_analysis import compile_train_step

BASE = ViTConfig.named("tiny", patch=8, image_size=32)
IMAGES = jax.random.normal(jax.random.key(1), (16, 32, 32, 3))


def forward_and_grad(cfg: ViTConfig, mesh):
    """(tokens, parameter gradients) of a random linear function of the encoder's output. Not the
    mean square: the final LayerNorm makes that constant in its input, which leaves every block
    gradient ~1e-7, under `assert_trees_close`'s zero-leaf threshold; a random projection gives
    them O(1) norms relative to the largest leaf."""
    abstract = nnx.eval_shape(lambda: ViT(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract, nnx.Param)
    init = lambda: nnx.to_pure_dict(nnx.state(ViT(cfg, rngs=nnx.Rngs(0)), nnx.Param))
    params = jax.jit(init, out_shardings=tree_shardings(state, mesh))()

    def loss(p):
        tokens = nnx.merge(graphdef, p)(IMAGES)
        return jnp.mean(tokens * jax.random.normal(jax.random.key(2), tokens.shape)), tokens

    with jax.set_mesh(mesh):
        (_, tokens), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(tokens), jax.device_get(grads)


PIPELINE_CASES = [(2, 1, 2, "pipeline=2,data=4"), (2, 2, 4, "pipeline=2,data=2,tensor=2"),
                  (4, 1, 4, "pipeline=4,tensor=2"), (4, 2, 8, "pipeline=4,data=2")]
"""(stages, repeats, microbatches, mesh) of the encoder-equivalence checks."""


def assert_pipelined_encoder_equals_the_plain_scan(stages: int, repeats: int, microbatches: int, spec: str,
                                                   devices, **pipeline) -> None:
    """Tokens and gradients of the pipelined encoder (ViTConfig fields `pipeline`) within 1e-5 of the plain scan's."""
    plain = dataclasses.replace(BASE, pipeline_repeats=repeats)
    reference = forward_and_grad(plain, make_mesh("data=1", devices=devices[:1]))
    piped = dataclasses.replace(plain, pipeline_stages=stages, pipeline_microbatches=microbatches, **pipeline)
    tokens, grads = forward_and_grad(piped, make_mesh(spec))
    assert_trees_close(tokens, reference[0], 1e-5)
    assert_trees_close(grads, reference[1], 1e-5)


@pytest.mark.parametrize("stages, repeats, microbatches, spec", PIPELINE_CASES)
def test_pipelined_encoder_equals_the_plain_scan(stages, repeats, microbatches, spec, devices):
    assert_pipelined_encoder_equals_the_plain_scan(stages, repeats, microbatches, spec, devices)


def test_bubble_fraction_and_schedule_errors():
    assert bubble_fraction(4, 1, 8) == pytest.approx(3 / 11)
    assert bubble_fraction(4, 2, 8) == pytest.approx(3 / 19)
    with pytest.raises(ValueError, match="depth 8 is not divisible by pipeline stages x pipeline.repeats = 4 x 3"):
        check_schedule(8, 4, 3, 4)
    with pytest.raises(ValueError, match="pipeline.microbatches=2 is fewer than the 4 pipeline stages"):
        check_schedule(8, 4, 1, 2)


@pytest.mark.parametrize(
    "flags, message",
    [(["--mesh", "pipeline=4,data=2", "--set", "pipeline.repeats=4"],
      "depth 8 is not divisible by pipeline stages x pipeline.repeats = 4 x 4"),
     (["--mesh", "pipeline=4,data=2", "--set", "pipeline.microbatches=2"], "fewer than the 4 pipeline stages"),
     (["--mesh", "pipeline=2,data=4", "--set", "pipeline.microbatches=3"],
      "not divisible by pipeline.microbatches x data x fsdp = 12"),
     (["--mesh", "pipeline=2,data=4", "--set", "pipeline.schedule=gpipe"],
      "config key 'pipeline.schedule' is 'gpipe'; choose one of circular, 1f1b"),
     (["--mesh", "pipeline=4,data=2", "--set", "pipeline.schedule=1f1b", "--set", "pipeline.repeats=2",
       "--set", "pipeline.microbatches=6", "--set", "data.global_batch=48"],
      "pipeline.microbatches=6 must be a multiple of 4; use pipeline.microbatches=8")],
)
def test_pipeline_config_errors(flags, message, tmp_path, capsys):
    assert train_main(["--workdir", str(tmp_path), "--no-progress", *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("single")
    run(workdir, "single", **{"run.steps": 5})
    return step_records(workdir)


@pytest.mark.slow
@pytest.mark.xdist_group("pipeline_single_device")  # one worker computes the module fixture once
@pytest.mark.parametrize("spec", ["pipeline=2,data=4", "pipeline=4,tensor=2", "pipeline=2,data=2,tensor=2"])
def test_training_on_pipeline_meshes_matches_one_device(spec, single_device, tmp_path, devices):
    run(tmp_path, spec, **{"run.steps": 5})
    records = step_records(tmp_path)
    for step, reference in single_device.items():
        for key in ("loss", "grad_norm"):
            assert relative_error(records[step][key], reference[key]) < 1e-4, (step, key)
    stages = int(spec.split(",")[0].split("=")[1])
    assert records[5]["pipeline_bubble"] == pytest.approx(bubble_fraction(stages, 1, 4))


def assert_moved_run_continues_the_straight_one(tmp_path, first: str, second: str, **resumed) -> None:
    """A 4-step run on mesh `first`, and the same run stopped after step 2 and resumed on `second`
    with the config keys `resumed` changed: the same losses (1e-5) and final parameters (1e-4)."""
    config = small_config(**{"run.steps": 4})
    train(config, tmp_path / "straight", mesh=mesh_of(first), progress=False)
    train(config, tmp_path / "moved", mesh=mesh_of(first), progress=False, stop_after_step=2)
    moved = train(small_config(**{"run.steps": 4, **resumed}), tmp_path / "moved", mesh=mesh_of(second),
                  progress=False)
    assert moved.first_step == 3
    records, reference = step_records(tmp_path / "moved"), step_records(tmp_path / "straight")
    for step in (3, 4):
        assert relative_error(records[step]["loss"], reference[step]["loss"]) < 1e-5
    assert_trees_close(final_params(tmp_path / "moved")[0], final_params(tmp_path / "straight")[0], 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("first, second", [("pipeline=2,data=4", "data=8"), ("data=8", "pipeline=2,data=4")])
def test_checkpoints_move_between_pipeline_and_data_meshes(first, second, tmp_path, devices):
    assert_moved_run_continues_the_straight_one(tmp_path, first, second)


def stack_gathers(hlo: str, depth: int) -> list[Collective]:
    """The all-gathers of a compiled program whose result is a float32 layer stack: `depth` (the
    stack's length) among its two leading dimensions, or its first three dimensions the schedule's
    (repeats, stages, layers per stage) view of the stack, multiplying to `depth`."""
    def is_stack(dims: tuple[int, ...]) -> bool:
        return depth in dims[:2] or (len(dims) > 3 and dims[1] > 1 and math.prod(dims[:3]) == depth)

    return [c for c in collectives(hlo) if c.kind == "all-gather"
            and any(dtype == "f32" and is_stack(dims) for dtype, dims in c.shapes)]


def test_pipelined_step_permutes_activations_and_never_gathers_the_layer_stack(devices):
    config = small_config()
    mesh = mesh_of("pipeline=2,data=4")
    parts = prepare(config, mesh)
    state = parts.init_state()
    source = parts.domain.open_split(config, "train")
    batch = host_to_global(TrainStepLoader(source, 32, 0, (0, 32))(0), mesh, 32)
    step = make_train_step(parts.graphdef, parts.tx, parts.schedule, 1, parts.shardings,
                           batch_shardings_of(batch, mesh, 32), mesh)
    with jax.set_mesh(mesh):
        hlo = step.lower(state, batch).compile().as_text()
    assert any(c.kind == "collective-permute" for c in collectives(hlo))
    kernel = state.params["backbone"]["blocks"]["mlp"]["up"]["kernel"]
    assert kernel.sharding.spec[0] == "pipeline" and kernel.addressable_shards[0].data.shape[0] == 4
    depth = kernel.shape[0]
    assert not stack_gathers(hlo, depth), "the layer stack is gathered"
    # Positive controls: programs built to gather the stack (the kernel, sharded over pipeline, made
    # whole), as it is stored and in the schedule's (repeats, stages, layers per stage) view.
    whole = jax.jit(lambda k: 2 * k, out_shardings=NamedSharding(mesh, PartitionSpec()))
    assert stack_gathers(whole.lower(kernel).compile().as_text(), depth)
    stages = mesh.shape["pipeline"]
    staged = jax.jit(lambda k: 2 * k.reshape(1, stages, depth // stages, *k.shape[1:]),
                     out_shardings=NamedSharding(mesh, PartitionSpec()))
    assert stack_gathers(staged.lower(kernel).compile().as_text(), depth)


# mars-tiny at depth 4 on pipeline=2,fsdp=4, M=4: each stage's 2 layers sharded 4 ways.
GATHER_CASE = {"model.depth": 4, "mesh": "pipeline=2,fsdp=4", "pipeline.microbatches": 4}


@pytest.fixture(scope="module")
def pipeline_fsdp_gathers():
    """{gather_once: (all-gather bytes per device measured in the compiled step, the parts)}."""
    measured = {}
    for gather_once in (True, False):
        parts = prepare(small_config(**GATHER_CASE, **{"pipeline.gather_once": gather_once}))
        compiled, _ = compile_train_step(parts)
        measured[gather_once] = program_cost(compiled.as_text(), parts.mesh.size).collective_bytes["all-gather"], parts
    return measured


@pytest.mark.xdist_group("pipeline_fsdp_gathers")  # one worker compiles the module fixture once
def test_pipeline_with_fsdp_gathers_each_stage_once_per_step(pipeline_fsdp_gathers, devices):
    """Every parameter gathered once over fsdp=4 moves 3/4 of its whole size (the rule table's
    sharding with fsdp undone): 0.53 MB. Gathering once measures 0.55 MB (4% over: a few small
    arrays besides); gathering in each of the 5 iterations, forward and backward, 3.22 MB (6.1x)."""
    parts = pipeline_fsdp_gathers[True][1]
    params = nnx.state(nnx.eval_shape(parts.build_model), nnx.Param)
    once = 3 / 4 * bytes_per_device(params, parts.mesh, ("fsdp",))
    assert pipeline_fsdp_gathers[True][0] / once < 1.25
    assert pipeline_fsdp_gathers[False][0] / once > 5  # the per-iteration gathers are what it measures


@pytest.mark.xdist_group("pipeline_fsdp_gathers")  # one worker compiles the module fixture once
def test_the_planner_prices_both_pipeline_gathers(pipeline_fsdp_gathers, devices):
    """The planner's all-gather bytes for each `pipeline.gather_once` within 10% of the compiled
    step's (measured: 4% and 0.1%), and gathering once priced as faster but holding more memory."""
    config = pipeline_fsdp_gathers[True][1].config
    inputs = plan_inputs(config, "h200", 8, nodes=1)
    mesh = MeshSpec(pipeline=2, fsdp=4)
    priced = {g: evaluate(inputs, mesh, 4, 1, config.model.remat, g) for g in (True, False)}
    for gather_once, (measured, _) in pipeline_fsdp_gathers.items():
        assert relative_error(priced[gather_once].collective_bytes["all-gather"], measured) < 0.1, gather_once
    assert priced[True].comm_s["fsdp"] < priced[False].comm_s["fsdp"]
    assert priced[True].memory.total > priced[False].memory.total


def assert_pipeline_with_fsdp_equals_the_plain_scan(devices, **pipeline) -> None:
    plain = dataclasses.replace(BASE, depth=4, pipeline_repeats=2)
    reference = forward_and_grad(plain, make_mesh("data=1", devices=devices[:1]))
    piped = dataclasses.replace(plain, pipeline_stages=2, pipeline_microbatches=4, **pipeline)
    tokens, grads = forward_and_grad(piped, make_mesh("pipeline=2,fsdp=4"))
    assert_trees_close(tokens, reference[0], 1e-5)
    assert_trees_close(grads, reference[1], 1e-5)


@pytest.mark.parametrize("gather_once", [True, False])
def test_pipeline_with_fsdp_equals_the_plain_scan(gather_once, devices):
    assert_pipeline_with_fsdp_equals_the_plain_scan(devices, pipeline_gather_once=gather_once)
