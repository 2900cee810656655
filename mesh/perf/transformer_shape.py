"""The planner's transformer shape: a transformer known only by its sizes
(`width=W,depth=L,heads=H,mlp=M,tokens=S[,vocab=V]`), its cost shape and a device's share of its
parameters on a mesh, for planning models that are not built here (a published run, a model too
large to trace)."""

from __future__ import annotations

from collections.abc import Callable

from triskele.mesh.perf.formulas import ParamBytes
from triskele.mesh.shape import ModelShape
from triskele.mesh.spec import MeshSpec

SHAPE_KEYS = ("width", "depth", "heads", "mlp", "tokens", "vocab")


def parse_shape(text: str) -> ModelShape:
    """`width=W,depth=L,heads=H,mlp=M,tokens=S[,vocab=V]` -> the planner's ModelShape. `tokens` is the
    sequence length; `vocab` adds a language model's output layer (split over `tensor`, as
    Megatron-LM's vocabulary-parallel logits)."""
    sizes: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in SHAPE_KEYS:
            raise ValueError(f"--shape {text!r}: {item!r} is not KEY=VALUE with KEY one of {', '.join(SHAPE_KEYS)}")
        try:
            sizes[key.strip()] = int(value)
        except ValueError:
            raise ValueError(f"--shape {text!r}: {key.strip()} must be an integer, got {value!r}") from None
    missing = [k for k in SHAPE_KEYS[:-1] if k not in sizes]
    if missing:
        raise ValueError(f"--shape {text!r} lacks {', '.join(missing)}; e.g. width=1024,depth=24,heads=16,"
                         "mlp=4096,tokens=197")
    if any(v < 1 for v in sizes.values()) or sizes["width"] % sizes["heads"]:
        raise ValueError(f"--shape {text!r}: sizes must be positive and width a multiple of heads")
    width, tokens, vocab = sizes["width"], sizes["tokens"], sizes.get("vocab", 0)
    return ModelShape(width=width, depth=sizes["depth"], mlp_dim=sizes["mlp"], heads=sizes["heads"],
                      patches=tokens, patch_dim=0, class_token=False, head_split_flops=2.0 * tokens * width * vocab,
                      vocab=vocab)


def block_params(shape: ModelShape) -> tuple[float, float]:
    """(parameters a block splits over `tensor`, parameters every tensor device holds whole) of one
    block: QKV, out projection, MLP up and down (and their split biases); the rest of the biases and
    the two LayerNorms."""
    d, m = shape.width, shape.mlp_dim
    return 4.0 * d * d + 2.0 * d * m + 3 * d + m, 6.0 * d


def param_bytes(shape: ModelShape, bytes_per_param: float = 4.0) -> Callable[[MeshSpec], ParamBytes]:
    """A device's share of the parameters on a mesh: the blocks split over tensor, fsdp and
    pipeline; the embeddings (vocabulary split over tensor) over tensor and fsdp."""

    def on(mesh: MeshSpec) -> ParamBytes:
        split, whole = block_params(shape)
        blocks = shape.depth / mesh.pipeline * (split / mesh.tensor + whole) * bytes_per_param
        other = (shape.vocab * shape.width / mesh.tensor + shape.tokens * shape.width) * bytes_per_param
        return ParamBytes(blocks=blocks / mesh.fsdp, other=other / mesh.fsdp, blocks_fsdp_gathered=blocks,
                          other_fsdp_gathered=other)

    return on


def validator(shape: ModelShape, global_batch: int) -> Callable[[MeshSpec, int, int, str], str | None]:
    """What a Megatron-style run of the shape requires of a mesh and its schedule (the same for
    either pipeline schedule)."""

    def check(mesh: MeshSpec, microbatches: int, repeats: int, schedule: str = "circular") -> str | None:
        if shape.heads % mesh.tensor or shape.mlp_dim % mesh.tensor:
            return f"tensor={mesh.tensor} does not divide heads {shape.heads} and mlp {shape.mlp_dim}"
        if global_batch % mesh.batch_shards:
            return f"the batch {global_batch} does not split over {mesh.batch_shards} batch shards"
        if shape.depth % (mesh.pipeline * repeats):
            return f"depth {shape.depth} does not split into {mesh.pipeline} stages x {repeats} repeats"
        if (global_batch // mesh.batch_shards) % microbatches:
            return f"{global_batch // mesh.batch_shards} records per shard do not split into {microbatches}"
        return None

    return check
