"""Building blocks with logical axis names on every parameter and compute-dtype casting."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from triskele.mesh import partitioned
from triskele.models.fp8 import fp8_dot
from triskele.models.quantize import check_format, dequantize, stored_shapes


def fan_avg_uniform(num_in: int, num_out: int) -> nnx.Initializer:
    """Xavier-uniform for a kernel whose first `num_in` axes are inputs and next `num_out` outputs."""
    return nnx.initializers.variance_scaling(
        1.0,
        "fan_avg",
        "uniform",
        in_axis=tuple(range(num_in)),
        out_axis=tuple(range(num_in, num_in + num_out)),
    )


class Dense(nnx.Module):
    """A linear map contracting the last `len(in_shape)` axes of x into `out_shape` axes.

    `fp8`: the matmul runs in FP8 with current scaling (training; see `triskele.models.fp8`).
    `quantization` (int8, fp8, fp4): the kernel is stored quantized and dequantized in the
    forward (inference; see `triskele.models.quantize`). Both are static: part of the graph.
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        out_shape: Sequence[int],
        in_names: Sequence[str | None],
        out_names: Sequence[str | None],
        *,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
        kernel_init: nnx.Initializer | None = None,
        use_bias: bool = True,
        bias_gradient: bool = True,
        fp8: bool = False,
        quantization: str | None = None,
    ):
        in_shape, out_shape = tuple(in_shape), tuple(out_shape)
        self.in_shape, self.out_shape = in_shape, out_shape
        self.quantization = quantization
        if quantization is None:
            init = kernel_init or fan_avg_uniform(len(in_shape), len(out_shape))
            self.kernel = nnx.Param(
                partitioned(init, *in_names, *out_names)(rngs.params(), in_shape + out_shape, jnp.float32)
            )
        else:
            self.kernel = None
            shapes = stored_shapes(check_format(quantization), in_shape, out_shape)
            names = {"codes": (*in_names, *out_names), "scale": tuple(out_names)}
            if quantization == "fp4":
                names = {"codes": (in_names[0], out_names[0]), "block_scale": (in_names[0], out_names[0]),
                         "global_scale": ()}
            dtypes = {"codes": jnp.int8 if quantization == "int8" else jnp.uint8, "block_scale": jnp.uint8}
            for key, shape in shapes.items():
                zeros = partitioned(nnx.initializers.zeros, *names[key])
                setattr(self, key, nnx.Param(zeros(rngs.params(), shape, dtypes.get(key, jnp.float32))))
        self.bias = (
            nnx.Param(partitioned(nnx.initializers.zeros, *out_names)(rngs.params(), out_shape, jnp.float32))
            if use_bias
            else None
        )
        self.num_in = len(in_shape)
        self.dtype = dtype
        self.bias_gradient = bias_gradient
        self.fp8 = fp8

    def kernel_value(self) -> jax.Array:
        """The kernel (in..., out...) in the compute dtype (dequantized if stored quantized)."""
        if self.quantization is None:
            return self.kernel[...].astype(self.dtype)
        stored = {key: getattr(self, key)[...] for key in stored_shapes(self.quantization, self.in_shape,
                                                                         self.out_shape)}
        return dequantize(stored, self.quantization, self.in_shape, self.out_shape, self.dtype)

    def bias_value(self) -> jax.Array | None:
        if self.bias is None:
            return None
        bias = self.bias[...] if self.bias_gradient else jax.lax.stop_gradient(self.bias[...])
        return bias.astype(self.dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        return project(x, self.kernel_value(), self.bias_value(), self.num_in, self.dtype, self.fp8)


def project(x: jax.Array, kernel: jax.Array, bias: jax.Array | None, num_in: int, dtype: jnp.dtype,
            fp8: bool = False) -> jax.Array:
    """x contracted over its last `num_in` axes with the kernel's first `num_in`, plus the bias."""
    x = x.astype(dtype)
    y = fp8_dot(x, kernel, num_in) if fp8 else jnp.tensordot(x, kernel, axes=num_in)
    return y if bias is None else y + bias


class LayerNorm(nnx.Module):
    """LayerNorm over the last axis, computed in float32, returned in the compute dtype."""

    def __init__(self, features: int, name: str = "embed", *, dtype: jnp.dtype, rngs: nnx.Rngs, eps: float = 1e-6):
        self.scale = nnx.Param(partitioned(nnx.initializers.ones, name)(rngs.params(), (features,), jnp.float32))
        self.bias = nnx.Param(partitioned(nnx.initializers.zeros, name)(rngs.params(), (features,), jnp.float32))
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(jnp.float32)
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + self.eps) * self.scale[...] + self.bias[...]
        return y.astype(self.dtype)


def normal_param(rngs: nnx.Rngs, shape: Sequence[int], names: Sequence[str | None], stddev: float) -> nnx.Param:
    return nnx.Param(partitioned(nnx.initializers.normal(stddev), *names)(rngs.params(), tuple(shape), jnp.float32))


def zeros_param(rngs: nnx.Rngs, shape: Sequence[int], names: Sequence[str | None]) -> nnx.Param:
    return nnx.Param(partitioned(nnx.initializers.zeros, *names)(rngs.params(), tuple(shape), jnp.float32))


def patchify(images: jax.Array, patch: int) -> jax.Array:
    """(B, H, W, C) -> (B, H/p * W/p, p*p*C), patches in row-major order."""
    b, h, w, c = images.shape
    x = images.reshape(b, h // patch, patch, w // patch, patch, c)
    x = x.transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // patch) * (w // patch), patch * patch * c)


class Conv(nnx.Module):
    """A 'SAME' 2D convolution, NHWC, with logically named kernel axes."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        names: tuple[str | None, str | None] = (None, None),
        *,
        dtype: jnp.dtype,
        rngs: nnx.Rngs,
        kernel_init: nnx.Initializer | None = None,
        bias_init: nnx.Initializer = nnx.initializers.zeros,
    ):
        shape = (kernel_size, kernel_size, in_channels, out_channels)
        init = kernel_init or nnx.initializers.variance_scaling(2.0, "fan_in", "truncated_normal", in_axis=(0, 1, 2),
                                                                out_axis=3)
        self.kernel = nnx.Param(partitioned(init, None, None, *names)(rngs.params(), shape, jnp.float32))
        bias_init = partitioned(bias_init, names[1])
        self.bias = nnx.Param(bias_init(rngs.params(), (out_channels,), jnp.float32))
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jax.lax.conv_general_dilated(
            x.astype(self.dtype), self.kernel[...].astype(self.dtype), (1, 1), "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )
        return y + self.bias[...].astype(self.dtype)
