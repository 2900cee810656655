"""FP8 matmuls with current scaling: e4m3 operands forward, e5m2 for the incoming gradient backward.

Each operand is scaled by its own amax (one float32 scale per tensor, computed from the tensor
itself, as Transformer Engine's Float8CurrentScaling does), clipped to the format's largest finite
value before the cast (e4m3fn has no infinity: an overflowing cast would give NaN), and a zero
tensor gets scale 1. The dot accumulates in float32; its result is rescaled and returned in the
compute dtype. Stateless: no amax history, so the train state, checkpoints, optimizer, gradient
accumulation and the pipeline are the same as without FP8.

Amax is local, as in Transformer Engine: under a context mesh the matmul runs in a `shard_map`
over the mesh axes that shard the batch (the rule table's `batch`), so each device scales its own
rows of the activations and incoming gradients and no scalar all-reduce over data x fsdp precedes
a cast (a tensor-sharded operand still reduces its amax over `tensor`, as TE's does). The kernel
enters whole (FSDP gathers it anyway) and its gradient is summed over the batch axes once, as the
plain matmul's is (with pipeline stages the amax stays global: see `batch_axes`). Scales are
powers of two: rounding x / 2^k to FP8 is the same for every k (away from the subnormals), so the
per-device scales give the numbers one device gives.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
from triskele.mesh import logical_to_mesh

E4M3 = jnp.float8_e4m3fn
E5M2 = jnp.float8_e5m2
E4M3_MAX = float(jnp.finfo(E4M3).max)  # 448
E5M2_MAX = float(jnp.finfo(E5M2).max)  # 57344


def scaled_cast(x: jax.Array, dtype, largest: float) -> tuple[jax.Array, jax.Array]:
    """(x / scale in `dtype`, scale): scale = amax(|x|) / largest rounded up to a power of two
    (1 where x is all zero)."""
    x32 = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(x32))
    scale = jnp.where(amax > 0, jnp.exp2(jnp.ceil(jnp.log2(amax / largest))), 1.0)
    return jnp.clip(x32 / scale, -largest, largest).astype(dtype), scale


def _contract(a, b, a_dims, b_dims, scale, dtype):
    dims = ((tuple(a_dims), tuple(b_dims)), ((), ()))
    return (jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32) * scale).astype(dtype)


def batch_axes(x: jax.Array) -> tuple[str, ...]:
    """The context mesh's axes that shard x's first (batch) axis by the rule table and are not
    manual already (inside a shard_map over them x is a local block): () without a mesh, and with
    pipeline stages (under the schedule's vmap over `pipeline` the shard_map's backward fails JAX's
    varying-axes check, so a pipeline keeps the global amax)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or x.ndim == 0 or mesh.shape.get("pipeline", 1) > 1:
        return ()
    spec = logical_to_mesh(("batch",), x.shape[:1], mesh)[0]
    axes = () if spec is None else (spec,) if isinstance(spec, str) else tuple(spec)
    return tuple(a for a in axes if a not in mesh.manual_axes)


def fp8_dot(x: jax.Array, kernel: jax.Array, num_in: int) -> jax.Array:
    """x's last `num_in` axes contracted with the kernel's first `num_in`, in FP8, each device
    scaling its own rows of the batch (see module doc)."""
    axes = batch_axes(x)
    if not axes:
        return _fp8_dot(x, kernel, num_in)
    rows = PartitionSpec(axes if len(axes) > 1 else axes[0])

    def local(x, kernel32):
        # Made varying over the axes, the kernel's gradient is their psum (the transpose). In float32
        # (the same values: the casts read it in float32) the shards' gradients are summed before
        # one rounding to the kernel's dtype, as the unsharded matmul's are.
        return _fp8_dot(x, jax.lax.pcast(kernel32, axes, to="varying"), num_in)

    return jax.shard_map(local, in_specs=(rows, PartitionSpec()), out_specs=rows,
                         axis_names=set(axes))(x, kernel.astype(jnp.float32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _fp8_dot(x: jax.Array, kernel: jax.Array, num_in: int) -> jax.Array:
    return _forward(x, kernel, num_in)[0]


def _forward(x, kernel, num_in):
    xq, x_scale = scaled_cast(x, E4M3, E4M3_MAX)
    wq, w_scale = scaled_cast(kernel, E4M3, E4M3_MAX)
    x_dims = range(x.ndim - num_in, x.ndim)
    y = _contract(xq, wq, x_dims, range(num_in), x_scale * w_scale, x.dtype)
    dtypes = (jnp.zeros((), x.dtype), jnp.zeros((), kernel.dtype))  # residuals must be arrays
    return y, (xq, x_scale, wq, w_scale, dtypes)


def _backward(num_in, residuals, grad):
    xq, x_scale, wq, w_scale, (x_dtype, w_dtype) = residuals
    x_dtype, w_dtype = x_dtype.dtype, w_dtype.dtype
    gq, g_scale = scaled_cast(grad, E5M2, E5M2_MAX)
    lead = xq.ndim - num_in  # batch-like axes of x (and of the output)
    num_out = wq.ndim - num_in
    # dx: the gradient's output axes against the kernel's output axes -> (lead..., in...).
    dx = _contract(gq, wq, range(lead, lead + num_out), range(num_in, num_in + num_out), g_scale * w_scale, x_dtype)
    # dw: x's lead axes against the gradient's lead axes -> (in..., out...).
    dw = _contract(xq, gq, range(lead), range(lead), x_scale * g_scale, w_dtype)
    return dx, dw


_fp8_dot.defvjp(lambda x, kernel, num_in: _forward(x, kernel, num_in), _backward)
