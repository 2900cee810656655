"""Crafted and damaged weight files (safetensors, .npz, a Hugging Face config.json): each is a
ValueError naming the file and what is wrong, found before anything is allocated; the command line
turns it into exit 2 without a traceback; and a few hundred mutated files either load arrays of
the shapes their headers state or raise ValueError, with no other exception and a bounded RSS."""

import io
import json
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from triskele.train.weights.pretrained import NPZ_MAX_EXPANSION, NpzFile, WeightFile
from triskele.train.weights.safetensors import MAX_HEADER, SafetensorsFile, write_safetensors

FIXTURES = Path(__file__).parent / "fixtures" / "pretrained"
ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}

FUZZ_RSS_BOUND_MB = 64
"""The most the peak RSS may grow over all 500 fuzzed files (each under 0.5 MB); measured: 13 MB."""
LARGE_RSS_BOUND_MB = 16
"""The most it may grow refusing a 30 MB header or a 500 MB zip bomb; measured: 0 MB (before: 746 MB,
and 1.4 GB for a 1.5 GB bomb)."""


def raw_safetensors(path: Path, header, data: bytes = b"\0" * 8) -> Path:
    """A safetensors file with `header` (JSON-encoded unless bytes) as written, right or wrong."""
    encoded = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return path


def npy_bytes(header: str | dict, data: bytes, version: tuple[int, int] = (1, 0)) -> bytes:
    """A .npy member with `header` (a dict, or its text as crafted) in format `version`."""
    text = header if isinstance(header, str) else repr(header)
    text += " " * (-(len(text) + 11) % 64) + "\n"
    size = struct.pack("<H" if version == (1, 0) else "<I", len(text))
    return b"\x93NUMPY" + bytes(version) + size + text.encode("latin1") + data


def raw_npz(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, payload in members.items():
            archive.writestr(name, payload)
    return path


def f4(shape) -> dict:
    return {"descr": "<f4", "fortran_order": False, "shape": tuple(shape)}


def deflated_zeros_npz(path: Path, nbytes: int) -> Path:
    """An .npz whose one member is `nbytes` of zeros (deflated ~1000-fold), written in chunks."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("bomb.npy", "w", force_zip64=True) as member:
            member.write(npy_bytes({"descr": "<f8", "fortran_order": False, "shape": (nbytes // 8,)}, b""))
            chunk = bytes(1 << 24)
            for start in range(0, nbytes, len(chunk)):
                member.write(chunk[: min(len(chunk), nbytes - start)])
    return path


def rss_growth_mb(run) -> float:
    """How far this process's peak RSS rises above its current RSS while `run()` runs, in MB
    (Linux: VmHWM is reset to the current RSS through /proc/self/clear_refs)."""
    def status(key: str) -> int:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key + ":"))
        return int(line.split()[1])

    Path("/proc/self/clear_refs").write_text("5")
    before = status("VmRSS")
    run()
    return (status("VmHWM") - before) / 1024


SAFETENSORS_CASES = {
    "header is a list": ([1, 2], "is not a JSON object of tensor entries"),
    "string entry": ({"a": "x"}, "is not a JSON object of tensor entries"),
    "entry without data_offsets": ({"a": {"dtype": "F32", "shape": [2]}}, "tensor 'a' has no data_offsets"),
    "400 KB of nested brackets": (b"[" * 200_000 + b"]" * 200_000, "nests deeper than Python parses"),
    "negative offsets": ({"a": {**ENTRY, "data_offsets": [-8, 0]}}, "not [begin, end] with 0 <= begin <= end"),
    "begin after end": ({"a": {**ENTRY, "data_offsets": [8, 0]}}, "not [begin, end] with 0 <= begin <= end"),
    "overlapping offsets": ({"a": {**ENTRY, "shape": [1], "data_offsets": [0, 4]},
                             "b": {**ENTRY, "data_offsets": [0, 8]}}, "tensors 'a' and 'b' overlap"),
    "shape of -1": ({"a": {**ENTRY, "shape": [-1]}}, "has shape [-1], not a list of at most 32 non-negative"),
    "shape of true": ({"a": {**ENTRY, "shape": [True, 2]}}, "not a list of at most 32 non-negative"),
    "shape and offsets disagree": ({"a": {**ENTRY, "shape": [3]}}, "has 12 bytes, but its data_offsets [0, 8] hold 8"),
    "empty tensor with a huge dimension": ({"a": {**ENTRY, "shape": [0, 2**62], "data_offsets": [0, 0]}},
                                           "whose other dimensions are more elements"),
    "range past the data": ({"a": {**ENTRY, "shape": [4], "data_offsets": [0, 16]}}, "is truncated"),
    "unknown dtype": ({"a": {**ENTRY, "dtype": "F4"}}, "has dtype \"F4\", which is not read here"),
    "dtype not a string": ({"a": {**ENTRY, "dtype": ["F32"]}}, "has dtype [\"F32\"], which is not read here"),
    "__metadata__ a list": ({"__metadata__": [1], "a": ENTRY}, "its __metadata__ is not an object of strings"),
    "__metadata__ a number value": ({"__metadata__": {"k": 1}, "a": ENTRY}, "is not an object of strings to strings"),
}


@pytest.mark.parametrize("case", SAFETENSORS_CASES)
def test_a_crafted_safetensors_header_is_a_value_error_naming_the_file(case, tmp_path):
    header, message = SAFETENSORS_CASES[case]
    path = raw_safetensors(tmp_path / "crafted.safetensors", header)
    with pytest.raises(ValueError, match="crafted.safetensors") as raised:
        WeightFile(path)
    assert message in str(raised.value), str(raised.value)


def test_a_header_longer_than_the_cap_is_refused_unread(tmp_path):
    path = tmp_path / "metadata.safetensors"  # a 30 MB __metadata__ list: parsed, it took 746 MB
    raw_safetensors(path, b'{"__metadata__":[' + b"{}," * 10_000_000 + b'{}],"a":' + json.dumps(ENTRY).encode() + b"}")
    growth = rss_growth_mb(lambda: pytest.raises(ValueError, SafetensorsFile, path))
    assert growth < LARGE_RSS_BOUND_MB
    with pytest.raises(ValueError, match=f"{path} is not a weights file: .* say 30000080 bytes; this reader takes "
                                         f"headers of at most {MAX_HEADER} bytes"):
        WeightFile(path)


NPZ_CASES = {
    "shape (2**40,) on 16 bytes": ({"a.npy": npy_bytes(f4([2**40]), bytes(16))},
                                   "header says shape (1099511627776,) of float32 (4398046511104 bytes), but the "
                                   "member holds 16 bytes"),
    "fewer bytes than the shape": ({"a.npy": npy_bytes(f4([4]), bytes(8))}, "(16 bytes), but the member holds 8"),
    "negative dimension": ({"a.npy": npy_bytes(f4([-2]), bytes(8))},
                           "holds shape (-2,) of dtype float32, not an array"),
    "object dtype": ({"a.npy": npy_bytes({"descr": "|O", "fortran_order": False, "shape": (1,)}, bytes(8))},
                     "of dtype object, not an array of numbers"),
    "not a .npy header": ({"a.npy": b"PK\x03\x04 something else"}, "member 'a.npy' has no readable .npy header"),
    "header of nested brackets": ({"a.npy": npy_bytes("(" * 5000 + ")" * 5000, b"")}, "has no readable .npy header"),
    "header length past the member": ({"a.npy": npy_bytes(f4([1]), b"", version=(2, 0))[:8] + b"\xff\xff\xff\x7f"},
                                      "has no readable .npy header"),
    "format version 9": ({"a.npy": npy_bytes(f4([1]), bytes(4), version=(9, 0))}, "format version (9, 0)"),
    "a member that is no array": ({"a.npy": npy_bytes(f4([1]), bytes(4)), "notes.txt": b"hi"},
                                  "member 'notes.txt' is not one .npy array"),
}


@pytest.mark.parametrize("case", NPZ_CASES)
def test_a_crafted_npz_is_a_value_error_naming_the_file(case, tmp_path):
    members, message = NPZ_CASES[case]
    path = raw_npz(tmp_path / "crafted.npz", members)
    with pytest.raises(ValueError, match=f"{path} is not a valid .npz file: ") as raised:
        WeightFile(path)
    assert message in str(raised.value), str(raised.value)


def test_a_zip_bomb_is_refused_from_the_zip_directory_without_decompressing(tmp_path):
    path = deflated_zeros_npz(tmp_path / "bomb.npz", 500_000_000)  # once decompressed to read its shape
    growth = rss_growth_mb(lambda: pytest.raises(ValueError, NpzFile, path))
    assert growth < LARGE_RSS_BOUND_MB
    with pytest.raises(ValueError, match=f"would expand the {path.stat().st_size}-byte archive to 500000128 bytes, "
                                         f"more than {NPZ_MAX_EXPANSION}x"):
        WeightFile(path)


def test_damaged_array_data_is_a_value_error_when_read(tmp_path):
    values = np.random.default_rng(0).normal(size=2**16).astype("<f4")
    path = raw_npz(tmp_path / "damaged.npz", {"a.npy": npy_bytes(f4(values.shape), values.tobytes())})
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # in the array's data, past the part read for the header: a bad CRC-32
    path.write_bytes(bytes(raw))
    arrays = NpzFile(path)
    assert arrays.shapes == {"a": values.shape}
    with pytest.raises(ValueError, match=f"{path} is not a valid .npz file: array 'a' cannot be read"):
        arrays.get("a")


@pytest.mark.parametrize("config, message", [
    ("[1, 2]", "is not a readable Hugging Face config: it is not a JSON object"),
    ("[" * 100_000, "is not a readable Hugging Face config"),
    ('{"num_attention_heads": "12"}', "has num_attention_heads '12', not a positive integer"),
    ('{"layer_norm_eps": [1e-12]}', "has layer_norm_eps [1e-12], not a positive number"),
], ids=["a list", "nested brackets", "heads a string", "eps a list"])
def test_a_crafted_config_json_beside_the_weights_is_a_value_error_naming_it(config, message, tmp_path):
    (tmp_path / "config.json").write_text(config)
    write_safetensors(tmp_path / "model.safetensors", {"a": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match=f"{tmp_path / 'config.json'}") as raised:
        WeightFile(tmp_path)
    assert message in str(raised.value)


def test_the_command_line_says_what_is_wrong_with_exit_2_and_no_traceback(tmp_path):
    path = raw_safetensors(tmp_path / "crafted.safetensors", {"a": {"dtype": "F32", "shape": [2]}})
    done = subprocess.run([sys.executable, "-m", "triskele.train", "--print-config", "--init-from", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"error: {path} is not a valid safetensors file: tensor 'a' has no data_offsets; the file "
                           "is damaged or was not written by a safetensors writer\n")


# -- the fuzz test ---------------------------------------------------------------------------------

def mutated_header(rng: np.random.Generator, header: dict) -> bytes:
    """`header` with one entry, the metadata or the whole changed the ways a crafted file would."""
    header = json.loads(json.dumps(header))
    names = [k for k in header if k != "__metadata__"]
    name, other = rng.choice(names, 2)
    entry = header[name]
    numbers = [-1, 0, 1, 3, 4, 7, 2**31, 2**63, -(2**40), 10**30, 1.5, True, None, "8"]

    def pick(values: list):
        return values[rng.integers(len(values))]

    kind = rng.integers(10)
    if kind == 0:
        entry["data_offsets"] = [pick(numbers), pick(numbers)]
    elif kind == 1:
        begin, end = header[other]["data_offsets"]
        entry["data_offsets"] = [begin + int(rng.integers(-8, 9)), end + int(rng.integers(-8, 9))]
    elif kind == 2:
        entry["shape"] = [pick(numbers) for _ in range(rng.integers(0, 4))]
    elif kind == 3:
        entry["shape"] = entry["shape"][::-1] + ([1] if rng.random() < 0.5 else [])
    elif kind == 4:
        entry["dtype"] = pick(["F32", "F16", "BF16", "I8", "U8", "F8_E4M3", "BOOL", "F4", "", 3, None, ["F32"]])
    elif kind == 5:
        del entry[pick(["dtype", "shape", "data_offsets"])]
    elif kind == 6:
        header[name] = pick(["x", 1, None, [], [1, 2], {}])
    elif kind == 7:
        header["__metadata__"] = pick([[], "x", {"k": 1}, {"k": ["v"]}, None, {"k": "v"}])
    elif kind == 8:
        depth = int(rng.integers(1, 100_000))
        return json.dumps(header)[:-1].encode() + b',"deep":' + b"[" * depth + b"]" * depth + b"}"
    else:
        return json.dumps(list(header.values()) if rng.random() < 0.5 else header).encode()
    return json.dumps(header).encode()


def mutated_safetensors(rng: np.random.Generator, raw: bytes) -> bytes:
    """A valid file's bytes with its header rewritten, bytes flipped, its length changed or cut short."""
    (length,) = struct.unpack("<Q", raw[:8])
    header, data = json.loads(raw[8 : 8 + length]), raw[8 + length :]
    kind = rng.integers(5)
    if kind <= 1:
        encoded = mutated_header(rng, header)
        return struct.pack("<Q", len(encoded)) + encoded + data
    out = bytearray(raw)
    if kind == 2:  # flips, mostly in the header
        for at in rng.integers(0, 8 + length if rng.random() < 0.8 else len(raw), rng.integers(1, 5)):
            out[at] ^= 1 << int(rng.integers(8))
    elif kind == 3:
        out[:8] = struct.pack("<Q", int(rng.choice([0, 1, length - 1, length + 1, len(raw), 2**63, MAX_HEADER + 1])))
    else:
        del out[int(rng.integers(0, len(raw))) :]
    return bytes(out)


def mutated_npz(rng: np.random.Generator, members: dict[str, bytes]) -> bytes:
    """A valid archive's members with one .npy header, its data or the archive's bytes changed."""
    members = dict(members)
    name = list(members)[rng.integers(len(members))]
    npy = members[name]
    end = 10 + struct.unpack("<H", npy[8:10])[0]
    text, data = npy[10:end].decode("latin1"), npy[end:]
    kind = rng.integers(8)
    if kind == 0:
        shape = tuple(int(d) for d in rng.choice([-1, 0, 1, 2, 7, 32, 2**20, 2**40], rng.integers(0, 4)))
        members[name] = npy_bytes({**f4(shape), "descr": rng.choice(["<f4", "<f8", "|u1", ">i2"])}, data)
    elif kind == 1:
        members[name] = npy_bytes(rng.choice(["{'descr': '|O', 'fortran_order': False, 'shape': (1,)}",
                                              "{'descr': '<U3', 'fortran_order': False, 'shape': (2,)}",
                                              "{'descr': '<f4', 'fortran_order': 1, 'shape': (2,)}", "[1, 2]",
                                              "(" * 300 + ")" * 300, text.replace("'shape'", "'shapes'")]), data)
    elif kind == 2:
        members[name] = npy[: int(rng.integers(0, len(npy)))] if rng.random() < 0.5 else npy + bytes(8)
    elif kind == 3:
        members[name] = npy[:6] + bytes(rng.choice([[2, 0], [3, 0], [0, 1]])) + npy[8:]
    elif kind == 4:  # a member of zeros, deflated, beside the others
        count = int(rng.choice([2**10, 2**18, 2**20]))
        members["zeros.npy"] = npy_bytes(f4([count]), bytes(4 * count))
    buffer = io.BytesIO()
    compression = zipfile.ZIP_DEFLATED if kind == 4 or rng.random() < 0.3 else zipfile.ZIP_STORED
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for member, payload in members.items():
            archive.writestr(member, payload)
    out = bytearray(buffer.getvalue())
    if kind == 5:  # a member's sizes in the zip directory
        at = out.rfind(b"PK\x01\x02", 0, int(rng.integers(len(out) // 2, len(out))))
        if at >= 0:
            out[at + 20 : at + 28] = struct.pack("<II", *rng.integers(0, 2**32, 2))
    elif kind == 6:
        for at in rng.integers(0, len(out), rng.integers(1, 9)):
            out[at] ^= 1 << int(rng.integers(8))
    elif kind == 7:
        del out[int(rng.integers(0, len(out))) :]
    return bytes(out)


def check_loads_or_refuses(path: Path, outcomes: dict[str, int]) -> None:
    """Opens `path` as --init-from does and reads every array: shapes as stated, or ValueError."""
    try:
        arrays = (NpzFile if path.suffix == ".npz" else SafetensorsFile)(path)
        for name, shape in arrays.shapes.items():
            assert arrays.get(name).shape == shape, (path.name, name)
        WeightFile(path)  # the layout read from the shapes, as a run reads it
    except ValueError as err:
        assert str(path) in str(err), str(err)
        outcomes["refused"] += 1
        return
    outcomes["loaded"] += 1


def test_mutated_weight_files_load_their_stated_shapes_or_raise_value_error(tmp_path):
    rng = np.random.default_rng(37)
    raw = (FIXTURES / "timm_vit.safetensors").read_bytes()
    with zipfile.ZipFile(FIXTURES / "vit.npz") as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    outcomes = {"loaded": 0, "refused": 0}

    def fuzz():
        for case in range(300):
            path = tmp_path / f"{case}.safetensors"
            path.write_bytes(mutated_safetensors(rng, raw))
            check_loads_or_refuses(path, outcomes)
        for case in range(200):
            path = tmp_path / f"{case}.npz"
            path.write_bytes(mutated_npz(rng, members))
            check_loads_or_refuses(path, outcomes)

    growth = rss_growth_mb(fuzz)
    assert growth < FUZZ_RSS_BOUND_MB, growth
    assert outcomes["loaded"] > 25 and outcomes["refused"] > 250, outcomes  # both kinds of outcome exercised
