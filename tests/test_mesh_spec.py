import pytest
from triskele.mesh import MESH_AXES, MeshSpec, make_mesh


def test_axes_outermost_first():
    assert MESH_AXES == ("pipeline", "data", "fsdp", "tensor")


@pytest.mark.parametrize(
    "text, sizes",
    [
        ("data=8", dict(pipeline=1, data=8, fsdp=1, tensor=1)),
        ("data=2,fsdp=2,tensor=2", dict(pipeline=1, data=2, fsdp=2, tensor=2)),
        (" tensor = 4 , data=2 ", dict(pipeline=1, data=2, fsdp=1, tensor=4)),
        ("pipeline=2,data=-1", dict(pipeline=2, data=4, fsdp=1, tensor=1)),
        ("fsdp=-1,tensor=2", dict(pipeline=1, data=1, fsdp=4, tensor=2)),
        ("", dict(pipeline=1, data=8, fsdp=1, tensor=1)),
    ],
)
def test_parse_and_resolve(text, sizes):
    assert MeshSpec.parse(text).resolve(8) == sizes


def test_dict_spec_and_mesh_shape(devices):
    mesh = make_mesh({"tensor": 4, "data": 2})
    assert mesh.axis_names == MESH_AXES
    assert dict(mesh.shape) == {"pipeline": 1, "data": 2, "fsdp": 1, "tensor": 4}
    assert all(t.name == "Auto" for t in mesh.axis_types)


def test_tensor_is_innermost_on_neighbouring_devices(devices):
    mesh = make_mesh("data=2,tensor=4")
    ids = [[d.id for d in row] for row in mesh.devices.reshape(2, 4)]
    assert ids == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_explicit_device_subset(devices):
    mesh = make_mesh("data=2", devices=devices[:2])
    assert mesh.devices.size == 2


@pytest.mark.parametrize(
    "text, message",
    [
        ("data=4", "uses 4 devices but 8 are available"),
        ("data=2,tensor=8", "uses 16 devices but 8 are available"),
        ("batch=8", "unknown axis 'batch'; axes are pipeline, data, fsdp, tensor"),
        ("data=0,tensor=8", "size of 'data' is 0"),
        ("data=-2,tensor=4", "size of 'data' is -2"),
        ("data=-1,tensor=-1", "at most one axis may be -1"),
        ("data=-1,tensor=3", "-1 on 'data' cannot fill 8 devices"),
        ("data", "'data' is not AXIS=SIZE"),
        ("data=two", "must be an integer"),
        ("data=2,data=4", "given twice"),
    ],
)
def test_errors_name_the_spec_and_the_fix(text, message, devices):
    with pytest.raises(ValueError) as info:
        make_mesh(text)
    assert message in str(info.value)
    assert "mesh spec" in str(info.value)
