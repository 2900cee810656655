"""What a request's tensors become: model records, and the model's rows back into the answer.
Two inputs: `image`, BYTES of encoded images (PNG/JPEG), each read by the domain's predict reader
(the same format and pixel checks before decoding, the same preprocessing; deepfake's reader takes
video files as well) and answered with the domain's outputs for it (`respond`); or `input`, FP32
records already shaped as the model takes them, answered with the model's raw outputs. A reader
that takes files beside each image (a shelf photo's planogram) names them in `serving_inputs`:
optional BYTES inputs sent with `image`, one element per image (an empty one: none for that image),
handed to the reader after the image, in that order."""

from __future__ import annotations

import dataclasses
import struct
import time
from typing import Any

import numpy as np
from triskele.eval.serving.protocol import RequestError, bad

IMAGE_INPUT = "image"
RECORDS_INPUT = "input"


READ_ERRORS = (ValueError, TypeError, struct.error, OverflowError, RecursionError)
"""What reading malformed bytes raises (the readers' own refusals are ValueErrors naming the file;
the others come from the parsers under them): a 400 naming the input, never a 500."""


def _unreadable(err: Exception, names: list[str]) -> str:
    """The reason for a 400: a reader's own refusal as it is (it names the file), else the input
    named with what its parser raised."""
    if isinstance(err, ValueError) and any(name in str(err) for name in names):
        return str(err)
    return f"cannot read {names[0]}: {type(err).__name__}: {str(err)[:200]}"


@dataclasses.dataclass
class Decoded:
    records: np.ndarray
    contexts: list[tuple[Any, int]] | None
    """Per image: the reader's context and its number of records (None: records sent as they are)."""


class Decoder:
    """A domain's predict reader and its `respond` behind the two inputs; `record_shape`: one record's;
    a request makes at most `max_records` records (its images' tiles or video frames counted as they
    are read, so that reading stops at the first image over)."""

    def __init__(self, io: Any, record_shape: tuple[int, ...], max_records: int):
        self.io, self.record_shape, self.max_records = io, tuple(record_shape), max_records
        self.outputs = io.serving_outputs  # a domain (or task) that serves nothing yet refuses here
        self.extras: dict[str, tuple[str, list[int]]] = getattr(io, "serving_inputs", {})  # most readers take none

    def metadata(self, raw_outputs: dict[str, tuple[int, ...]]) -> dict[str, list[dict[str, Any]]]:
        """The inputs and outputs of the model's metadata (-1: a size that varies)."""
        return {"inputs": [{"name": IMAGE_INPUT, "datatype": "BYTES", "shape": [-1]},
                           *[{"name": name, "datatype": datatype, "shape": shape}
                             for name, (datatype, shape) in self.extras.items()],
                           {"name": RECORDS_INPUT, "datatype": "FP32", "shape": [-1, *self.record_shape]}],
                "outputs": [{"name": name, "datatype": datatype, "shape": [-1, *shape]}
                            for name, (datatype, shape) in self.outputs.items()]
                + [{"name": name, "datatype": "FP32", "shape": [-1, *shape]} for name, shape in raw_outputs.items()]}

    def decode(self, inputs: dict[str, np.ndarray], deadline: float) -> Decoded:
        """The request's records; a RequestError (400) naming what is wrong with its tensors or images,
        a 504 when the deadline (time.monotonic()) passes before its next image is read (its handler
        has answered 504 already: no more of its images are read)."""
        from triskele.eval.engine import Unit
        from triskele.train.data.images import EncodedImage

        if list(inputs) != [RECORDS_INPUT] and (IMAGE_INPUT not in inputs or set(inputs) - {IMAGE_INPUT, *self.extras}):
            beside = "".join(f", with {name!r} optional" for name in self.extras)
            raise bad(f"send one input, {IMAGE_INPUT!r} (BYTES: encoded PNG or JPEG images{beside}) or "
                      f"{RECORDS_INPUT!r} (FP32 records of shape [n, {', '.join(map(str, self.record_shape))}]); got "
                      f"{', '.join(map(repr, inputs))}")
        if RECORDS_INPUT in inputs:
            records = inputs[RECORDS_INPUT]
            if records.dtype != np.float32:
                raise bad(f"input {RECORDS_INPUT!r} must be FP32, got {records.dtype}")
            if records.ndim != 1 + len(self.record_shape) or records.shape[1:] != self.record_shape or not len(records):
                raise bad(f"input {RECORDS_INPUT!r} has shape {list(records.shape)}; the model takes "
                          f"[n, {', '.join(map(str, self.record_shape))}] with n >= 1")
            self._check_records(len(records), f"input {RECORDS_INPUT!r}")
            return Decoded(records, None)
        images = inputs[IMAGE_INPUT]
        if images.dtype != object:
            raise bad(f"input {IMAGE_INPUT!r} must be BYTES (encoded images), got {images.dtype}")
        if not images.size:
            raise bad(f"input {IMAGE_INPUT!r} holds no image")
        extras = {name: inputs[name].ravel() for name in self.extras if name in inputs}
        for name, files in extras.items():
            if inputs[name].dtype != object or len(files) != images.size:
                raise bad(f"input {name!r} must be BYTES with one element per image ({images.size}), got "
                          f"{inputs[name].dtype} of shape {list(inputs[name].shape)}")
        parts, contexts, total = [], [], 0
        for i, data in enumerate(images.ravel()):
            name = f"{IMAGE_INPUT}[{i}]"
            if time.monotonic() > deadline:
                raise RequestError(504, f"the request's deadline passed before {name} was read (--timeout-seconds)")
            beside = tuple(EncodedImage(files[i], f"{extra}[{i}]") for extra, files in extras.items() if len(files[i]))
            try:
                records, context = self.io.read(Unit(name, (EncodedImage(data, name), *beside)))
            except READ_ERRORS as err:
                raise bad(_unreadable(err, [name, *map(str, beside)])) from None
            total += len(records)
            self._check_records(total, f"images {IMAGE_INPUT}[0] to {name}")
            parts.append(np.asarray(records, np.float32))
            contexts.append((context, len(records)))
        return Decoded(np.concatenate(parts), contexts)  # no records at all (a video without a face): no model call

    def _check_records(self, count: int, what: str) -> None:
        if count > self.max_records:
            raise RequestError(413, f"{what} make {count:,} records (images, tiles, video frames), over this "
                               f"server's limit of {self.max_records:,} a request (--max-records); send fewer or "
                               "smaller inputs a request")

    def respond(self, decoded: Decoded, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The answer's tensors: the domain's per image, stacked, or the raw rows."""
        if decoded.contexts is None:
            return outputs
        answers, offset = [], 0
        for context, count in decoded.contexts:
            answers.append(self.io.respond(context, {k: v[offset:offset + count] for k, v in outputs.items()}))
            offset += count
        stacked = {}
        for name in answers[0]:
            shapes = {np.shape(answer[name]) for answer in answers}
            if len(shapes) > 1:
                raise RequestError(422, f"output {name!r} has other shapes for this request's images "
                                   f"({', '.join(map(str, sorted(shapes)))}); send images of one size together, or "
                                   "one per request")
            stacked[name] = np.stack([answer[name] for answer in answers])
        return stacked
