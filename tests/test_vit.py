import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_trees_close
from flax import nnx
from jax.sharding import PartitionSpec as P
from triskele.mesh import make_mesh, tree_shardings
from triskele.models import VIT_SIZES, ViT, ViTClassifier, ViTConfig

MESHES = ["data=8", "fsdp=8", "tensor=4,data=2", "data=2,fsdp=2,tensor=2"]


def param_count(cfg: ViTConfig, classes: int) -> int:
    model = nnx.eval_shape(lambda: ViTClassifier(cfg, classes, rngs=nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize("size, patch, published", [("B", 16, 86.6e6), ("L", 16, 304.3e6), ("H", 14, 632.0e6)])
def test_classic_parameter_counts_match_the_papers(size, patch, published):
    count = param_count(ViTConfig.named(size, patch=patch), 1000)
    assert abs(count / published - 1) < 1e-3, count


def test_exact_vit_b16_count_and_all_sizes_build_abstractly():
    assert param_count(ViTConfig.named("B", patch=16), 1000) == 86_567_656
    for size in VIT_SIZES:
        assert param_count(ViTConfig.named(size, patch=14), 1000) > 0


def test_grayscale_and_gap_change_the_shapes():
    cfg = ViTConfig.named("tiny", patch=8, image_size=32, channels=1, pool="gap")
    model = ViT(cfg, rngs=nnx.Rngs(0))
    tokens = model(jnp.ones((2, 32, 32, 1)))
    assert tokens.shape == (2, 16, 64)
    assert model.pool(tokens).shape == (2, 64)
    assert model.patch_embed.kernel.shape == (8 * 8 * 1, 64)


@pytest.mark.parametrize(
    "field, value, message",
    [("image_size", 30, "not a multiple of model.patch"), ("pool", "max", "model.pool"), ("heads", 3, "heads 3")],
)
def test_config_errors(field, value, message):
    fields = {"patch": 8, "image_size": 32, field: value}
    with pytest.raises(ValueError, match=message):
        ViTConfig.named("tiny", **fields)


TINY = ViTConfig.named("tiny", patch=8, image_size=32, channels=3)

# The rules, written out: stacked layers lead, `embed` on fsdp, heads/mlp on tensor.
GOLDEN = {
    "data=8": {"up": P(None, None, None), "query": P(None, None, None, None), "pos": P(None, None, None)},
    "fsdp=8": {"up": P(None, "fsdp", None), "query": P(None, "fsdp", None, None), "pos": P(None, None, "fsdp")},
    "tensor=4,data=2": {"up": P(None, None, "tensor"), "query": P(None, None, "tensor", None), "pos": P()},
    "data=2,fsdp=2,tensor=2": {
        "up": P(None, "fsdp", "tensor"),
        "query": P(None, "fsdp", "tensor", None),
        "pos": P(None, None, "fsdp"),
    },
}


def normalise(spec: P) -> tuple:
    items = list(spec)
    while items and items[-1] is None:
        items.pop()
    return tuple(items)


def init_sharded(cfg: ViTConfig, mesh):
    abstract = nnx.eval_shape(lambda: ViT(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract, nnx.Param)
    shardings = tree_shardings(state, mesh)
    init = jax.jit(lambda: nnx.to_pure_dict(nnx.state(ViT(cfg, rngs=nnx.Rngs(0)), nnx.Param)), out_shardings=shardings)
    return graphdef, init(), shardings


@pytest.mark.parametrize("spec", MESHES)
def test_parameters_land_on_rule_shardings(spec, devices):
    mesh = make_mesh(spec)
    _, params, shardings = init_sharded(TINY, mesh)
    got = {
        "up": params["blocks"]["mlp"]["up"]["kernel"].sharding.spec,
        "query": params["blocks"]["attn"]["query"]["kernel"].sharding.spec,
        "pos": params["pos_embed"].sharding.spec,
    }
    assert {k: normalise(v) for k, v in got.items()} == {k: normalise(v) for k, v in GOLDEN[spec].items()}
    for array, sharding in zip(jax.tree.leaves(params), jax.tree.leaves(shardings), strict=True):
        assert array.sharding.is_equivalent_to(sharding, array.ndim)
    # A sharded parameter really is split: each device holds 1/n of it.
    kernel = params["blocks"]["mlp"]["up"]["kernel"]
    shard_size = kernel.addressable_shards[0].data.size
    split = mesh.shape["fsdp"] * mesh.shape["tensor"]
    assert shard_size * split == kernel.size


@pytest.fixture(scope="module")
def single_device_reference():
    graphdef, params, _ = init_sharded(TINY, make_mesh("data=1", devices=jax.devices()[:1]))
    images = jax.random.normal(jax.random.key(1), (8, 32, 32, 3))
    target = jax.random.normal(jax.random.key(2), (8, TINY.num_tokens, TINY.width))
    forward, grads = _forward_and_grad(graphdef, params, images, target)
    return graphdef, jax.device_get(params), images, target, forward, grads


def _forward_and_grad(graphdef, params, images, target):
    def loss(p):
        tokens = nnx.merge(graphdef, p)(images)
        return jnp.mean((tokens - target) ** 2), tokens

    (_, tokens), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(tokens), jax.device_get(grads)


@pytest.mark.parametrize("spec", MESHES)
def test_sharded_forward_and_gradients_equal_single_device(spec, single_device_reference, devices):
    graphdef, params_host, images, target, forward, grads = single_device_reference
    mesh = make_mesh(spec)
    _, _, shardings = init_sharded(TINY, mesh)
    params = jax.device_put(params_host, shardings)
    with jax.set_mesh(mesh):
        sharded_forward, sharded_grads = _forward_and_grad(graphdef, params, images, target)
    assert_trees_close(sharded_forward, forward, 1e-5)
    assert_trees_close(sharded_grads, grads, 1e-5)
    assert np.linalg.norm(forward) > 0 and np.linalg.norm(grads["blocks"]["mlp"]["up"]["kernel"]) > 0
