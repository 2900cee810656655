import pytest
from jax.sharding import PartitionSpec as P
from triskele.mesh import logical_to_mesh, make_mesh


def test_parameter_and_activation_names():
    assert logical_to_mesh(("embed", "mlp")) == P("fsdp", "tensor")
    assert logical_to_mesh(("layers", "embed", "heads", "kv")) == P("pipeline", "fsdp", "tensor", None)
    assert logical_to_mesh(("batch", "length", "act_embed")) == P(("data", "fsdp"), None, None)
    assert logical_to_mesh((None, "embed")) == P(None, "fsdp")


def test_unknown_name_is_an_error_not_a_mesh_axis():
    with pytest.raises(ValueError, match="unknown logical axis name 'data'"):
        logical_to_mesh(("data", "embed"))


def test_one_mesh_axis_never_shards_two_dimensions():
    # Both dimensions want `tensor`: the first gets it, the second falls to its next rule.
    assert logical_to_mesh(("mlp", "classes")) == P("tensor", None)
    assert logical_to_mesh(("embed", "embed")) == P("fsdp", None)
    # `batch` wants data and fsdp; after `embed` took fsdp it falls back to data alone.
    assert logical_to_mesh(("embed", "batch")) == P("fsdp", "data")


def test_first_match_skips_rules_that_do_not_divide(devices):
    mesh = make_mesh("data=2,tensor=4")
    assert logical_to_mesh(("embed", "classes"), (64, 8), mesh) == P(None, "tensor")
    assert logical_to_mesh(("embed", "classes"), (64, 6), mesh) == P(None, None)
    mesh = make_mesh("data=2,fsdp=4")
    assert logical_to_mesh(("batch",), (8,), mesh) == P(("data", "fsdp"))
    assert logical_to_mesh(("batch",), (2,), mesh) == P("data")


def test_size_one_mesh_axes_are_left_out(devices):
    mesh = make_mesh("data=8")
    assert logical_to_mesh(("embed", "mlp"), (64, 256), mesh) == P(None, None)
    assert logical_to_mesh(("batch", "act_embed"), (16, 64), mesh) == P("data", None)
