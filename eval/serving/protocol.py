"""The Open Inference Protocol v2 (KServe; Triton, MLServer speak it) as bytes in, arrays out:
an infer request's JSON, with Triton's binary-tensor extension (the JSON header's length in
`Inference-Header-Content-Length`, each binary input's bytes after it in order, sized by its
`binary_data_size` parameter; BYTES elements each prefixed by a 4-byte little-endian length), and
the response in the same two forms. Every malformed request is a `RequestError` naming the problem.
numpy only."""

from __future__ import annotations

import dataclasses
import json
import math
import reprlib
import struct
from typing import Any

import numpy as np

DATATYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
             "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
             "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_}
"""The protocol's tensor datatypes and the numpy dtypes they carry (BYTES: objects holding bytes)."""
HEADER_LENGTH = "Inference-Header-Content-Length"


class RequestError(Exception):
    """A request the server refuses: its HTTP status and the reason, answered as `{"error": reason}`."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None):
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers or {}


def bad(reason: str) -> RequestError:
    return RequestError(400, reason)


@dataclasses.dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[str] | None
    """The outputs asked for (None: all)."""
    binary: dict[str, bool]
    """Per output asked for: whether it goes back as binary data; `binary_default` for the rest."""
    binary_default: bool


def _header_length(value: str | None, body_length: int) -> int | None:
    if value is None:
        return None
    if not value.strip().isdigit() or int(value) > body_length:
        raise bad(f"{HEADER_LENGTH}: {value!r} is not a length within the body's {body_length} bytes")
    return int(value)


def _json_object(text: bytes) -> dict[str, Any]:
    try:
        request = json.loads(text)
    except (UnicodeDecodeError, ValueError) as err:
        raise bad(f"the request is not valid JSON: {err}") from None
    except RecursionError:
        raise bad("the request's JSON is nested too deeply") from None
    if not isinstance(request, dict):
        raise bad(f"the request must be a JSON object, got {type(request).__name__}")
    return request


def _shape(spec: dict[str, Any], name: str, room: int) -> tuple[list[int], int]:
    """(shape, its element count); a shape of more elements, or a dimension longer, than `room` (the
    body's bytes: every element takes one at least) is refused before anything is allocated."""
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise bad(f"input {name!r}: shape must be a list of non-negative integers, got {reprlib.repr(shape)}")
    count = math.prod(shape)
    if count > room or any(d > room for d in shape):
        raise bad(f"input {name!r}: shape {reprlib.repr(shape)} is more than a request of {room:,} bytes can hold")
    return shape, count


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parameters(holder: dict[str, Any], where: str) -> dict[str, Any]:
    """`holder`'s `parameters` (an object; absent or null: none)."""
    parameters = holder.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise bad(f"{where}: 'parameters' must be an object, got {type(parameters).__name__}")
    return parameters


def split_bytes(data: bytes, name: str, count: int) -> list[bytes]:
    """The `count` elements of a binary BYTES tensor (each prefixed by its 4-byte little-endian length)."""
    items, offset = [], 0
    while offset < len(data):
        if len(items) == count:
            raise bad(f"input {name!r}: its BYTES data hold more than the {count} elements of its shape")
        if offset + 4 > len(data):
            raise bad(f"input {name!r}: BYTES data ends inside an element's 4-byte length prefix")
        (size,) = struct.unpack_from("<I", data, offset)
        if offset + 4 + size > len(data):
            raise bad(f"input {name!r}: a BYTES element declares {size} bytes, {len(data) - offset - 4} are left")
        items.append(data[offset + 4:offset + 4 + size])
        offset += 4 + size
    return items


def _tensor(spec: Any, binary: memoryview, offset: int, room: int,
            max_bytes_elements: int) -> tuple[str, np.ndarray, int]:
    """(name, array, offset after its binary data) of one request input (`room`: the body's bytes);
    a BYTES input of more than `max_bytes_elements` elements is refused from its shape, before its
    data are looked at."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise bad(f"each input must be an object with a name, got {type(spec).__name__}")
    name = spec["name"]
    datatype = spec.get("datatype")
    if datatype not in DATATYPES:
        raise bad(f"input {name!r}: datatype {reprlib.repr(datatype)} is not one of {', '.join(DATATYPES)}")
    shape, count = _shape(spec, name, room)
    if datatype == "BYTES" and count > max_bytes_elements:
        raise RequestError(413, f"input {name!r}: shape {shape} holds {count:,} BYTES elements, over this server's "
                           f"limit of {max_bytes_elements:,} a request (--max-images); send them in several requests")
    size = _parameters(spec, f"input {name!r}").get("binary_data_size")
    if size is not None:
        if not _is_count(size) or offset + size > len(binary):
            raise bad(f"input {name!r}: binary_data_size {reprlib.repr(size)} runs past the {len(binary) - offset} "
                      "bytes of binary data left")
        raw = bytes(binary[offset:offset + size])
        offset += size
        if datatype == "BYTES":
            items = split_bytes(raw, name, count)
        else:
            itemsize = np.dtype(DATATYPES[datatype]).itemsize
            if size != count * itemsize:
                raise bad(f"input {name!r}: {size} bytes of binary data, shape {shape} of {datatype} needs "
                          f"{count * itemsize}")
            return name, np.frombuffer(raw, DATATYPES[datatype]).reshape(shape), offset
    elif "data" in spec:
        items = _values(spec["data"], name)
        if datatype == "BYTES":
            if not all(isinstance(item, str) for item in items):
                raise bad(f"input {name!r}: BYTES data in JSON must be strings")
            items = [item.encode() for item in items]
        else:
            try:
                array = np.asarray(items, DATATYPES[datatype])
            except (TypeError, ValueError, OverflowError):
                raise bad(f"input {name!r}: its data are not all {datatype} values") from None
            if array.size != count:
                raise bad(f"input {name!r}: {array.size} values, shape {shape} needs {count}")
            return name, array.reshape(shape), offset
    else:
        raise bad(f"input {name!r} has neither data nor a binary_data_size parameter")
    if len(items) != count:
        raise bad(f"input {name!r}: {len(items)} BYTES elements, shape {shape} needs {count}")
    array = np.empty(count, object)
    array[:] = items
    return name, array.reshape(shape), offset


def _values(data: Any, name: str) -> list[Any]:
    """The values of a tensor's JSON `data` (a list, nested or flat), in order."""
    if not isinstance(data, list):
        raise bad(f"input {name!r}: 'data' must be a list of values, got {type(data).__name__}")
    try:
        return np.asarray(data, dtype=object).ravel().tolist()
    except (ValueError, TypeError, RecursionError):
        raise bad(f"input {name!r}: 'data' is not a list of values nested as a tensor is") from None


def parse_infer(body: bytes, header_length: str | None, max_bytes_elements: int) -> InferRequest:
    """An infer request from its body and its `Inference-Header-Content-Length` header (None: all
    JSON); a BYTES input (images, one file each) holds at most `max_bytes_elements` elements."""
    length = _header_length(header_length, len(body))
    request = _json_object(body if length is None else body[:length])
    binary = memoryview(body)[len(body) if length is None else length:]
    specs = request.get("inputs")
    if not isinstance(specs, list) or not specs:
        raise bad("the request has no inputs (a list of tensors under 'inputs')")
    inputs, offset = {}, 0
    for spec in specs:
        name, array, offset = _tensor(spec, binary, offset, len(body), max_bytes_elements)
        if name in inputs:
            raise bad(f"input {name!r} is given twice")
        inputs[name] = array
    if offset != len(binary):
        raise bad(f"{len(binary) - offset} bytes of binary data are not claimed by any input's binary_data_size")
    wanted = request.get("outputs")
    if wanted is not None and (not isinstance(wanted, list) or
                               not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in wanted)):
        raise bad("'outputs' must be a list of objects with a name")
    request_id = request.get("id")
    if not isinstance(request_id, str | int | None) or isinstance(request_id, bool):
        raise bad(f"the request's id must be a string, got {type(request_id).__name__}")
    return InferRequest(id=None if request_id is None else str(request_id), inputs=inputs,
                        outputs=None if wanted is None else [o["name"] for o in wanted],
                        binary={o["name"]: bool(_parameters(o, f"output {o['name']!r}").get("binary_data"))
                                for o in wanted or []},
                        binary_default=bool(_parameters(request, "the request").get("binary_data_output")))


def datatype_of(array: np.ndarray) -> str:
    if array.dtype == object:
        return "BYTES"
    return next(name for name, dtype in DATATYPES.items() if np.dtype(dtype) == array.dtype)


def _bytes_items(array: np.ndarray) -> list[bytes]:
    return [item if isinstance(item, bytes) else str(item).encode() for item in array.ravel()]


def _json_values(array: np.ndarray) -> list[Any]:
    """`array`'s values, flat, as JSON can hold them: NaN and infinities (no JSON number) are null."""
    values = array.ravel().tolist()
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        return [value if math.isfinite(value) else None for value in values]
    return values


def encode_response(model: str, request: InferRequest, outputs: dict[str, np.ndarray]) -> tuple[bytes, int | None]:
    """(body, JSON header length when binary data follow it, else None) of an infer response."""
    unknown = [name for name in request.outputs or [] if name not in outputs]
    if unknown:
        raise bad(f"output {unknown[0]!r} is not one of this request's outputs: {', '.join(outputs)}")
    tensors, chunks = [], []
    for name in request.outputs or list(outputs):
        array = np.ascontiguousarray(outputs[name])
        tensor = {"name": name, "datatype": datatype_of(array), "shape": list(array.shape)}
        if request.binary.get(name, request.binary_default):
            raw = (b"".join(struct.pack("<I", len(item)) + item for item in _bytes_items(array))
                   if array.dtype == object else array.astype(array.dtype.newbyteorder("<")).tobytes())
            tensor["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            tensor["data"] = ([item.decode(errors="replace") for item in _bytes_items(array)]
                              if array.dtype == object else _json_values(array))
        tensors.append(tensor)
    response = {"model_name": model, "model_version": "1", "outputs": tensors}
    if request.id is not None:
        response["id"] = request.id
    header = json.dumps(response, allow_nan=False).encode()
    return header + b"".join(chunks), len(header) if chunks else None



def encode_request(inputs: dict[str, np.ndarray], request_id: str | None = None) -> tuple[bytes, dict[str, str]]:
    """A client's infer request of `inputs` in the binary-tensor extension (what tritonclient sends
    for binary_data=True), whatever the arrays hold (BYTES: object arrays of bytes, valid images or
    not): (body, its `Inference-Header-Content-Length` header). `parse_infer` reads it back."""
    specs, chunks = [], []
    for name, array in inputs.items():
        array = np.ascontiguousarray(array)
        raw = (b"".join(struct.pack("<I", len(item)) + item for item in array.ravel()) if array.dtype == object
               else array.astype(array.dtype.newbyteorder("<")).tobytes())
        specs.append({"name": name, "shape": list(array.shape), "datatype": datatype_of(array),
                      "parameters": {"binary_data_size": len(raw)}})
        chunks.append(raw)
    header = json.dumps({"inputs": specs} if request_id is None else {"id": request_id, "inputs": specs}).encode()
    return header + b"".join(chunks), {HEADER_LENGTH: str(len(header))}
