"""The performance model's formulas: analytic costs of one training step of a ViT-based model on a
mesh (FLOPs, collective bytes, memory) and the forward's HBM traffic.

Sizes in, numbers out. The same formulas feed the mesh planner and the log's MFU, and the benches
and tests hold them against what XLA compiled (`triskele.mesh.perf.hlo_counts`, `memory_analysis()`).
Conventions: a multiply-add is 2 FLOPs; training costs the forward once and the backward twice,
except where no input gradient is needed (the patch embedding, convolutions on raw pixels).
Bytes are per device and per step; collectives move bytes by the ring algorithm.
"""

from __future__ import annotations

import dataclasses

from triskele.mesh.schedule import ring_slots, schedule_iterations
from triskele.mesh.shape import ModelShape
from triskele.mesh.spec import MeshSpec


def block_forward_flops(shape: ModelShape) -> float:
    """One transformer block on one image: QKV, scores, weighted values, out projection, MLP."""
    t, d, m = shape.tokens, shape.width, shape.mlp_dim
    return 2.0 * t * (4 * d * d + 2 * d * m) + attention_forward_flops(shape)


def attention_forward_flops(shape: ModelShape) -> float:
    """The attention's own matmuls in one block on one image: scores (Q K^T) and weighted values,
    2 t^2 d each. The one term of a block's FLOPs that grows with the square of the sequence."""
    return 4.0 * shape.tokens * shape.tokens * shape.width


@dataclasses.dataclass(frozen=True)
class StepFlops:
    """FLOPs of a step, split by how a mesh divides them."""

    blocks: float
    """The transformer blocks: split over every mesh axis (batch shards, tensor, pipeline)."""
    attention: float
    """The part of `blocks` in the attention's own matmuls (`attention_forward_flops`)."""
    split: float
    """Head layers sharded over `tensor`: split over the batch shards and tensor."""
    replicated: float
    """Patch embedding and the rest of the head: split over the batch shards only."""

    @property
    def total(self) -> float:
        return self.blocks + self.split + self.replicated

    def per_device(self, mesh: MeshSpec) -> float:
        """Model FLOPs per device (what MFU counts)."""
        return (self.blocks / mesh.devices + self.split / (mesh.batch_shards * mesh.tensor)
                + self.replicated / mesh.batch_shards)

    def executed_per_device(self, mesh: MeshSpec, microbatches: int = 1, repeats: int = 1,
                            remat: str = "dots", schedule: str = "circular", attention: str = "xla") -> float:
        """FLOPs a device executes: the blocks' model FLOPs times `block_passes`, the attention's as
        `attention_executed_per_device` runs them."""
        passes = block_passes(mesh.pipeline, repeats, microbatches, remat, schedule)
        attention_model = self.attention / mesh.devices * passes
        return (self.per_device(mesh) + (self.blocks / mesh.devices) * (passes - 1) - attention_model
                + self.attention_executed_per_device(mesh, microbatches, repeats, remat, schedule, attention))

    def attention_executed_per_device(self, mesh: MeshSpec, microbatches: int = 1, repeats: int = 1,
                                      remat: str = "dots", schedule: str = "circular",
                                      attention: str = "xla") -> float:
        """The attention matmuls' share of `executed_per_device`: their model FLOPs times
        `block_passes`, and a fused kernel's recomputation (`FUSED_ATTENTION_RECOMPUTE`)."""
        recompute = FUSED_ATTENTION_RECOMPUTE if attention == "fused" else 1.0
        return self.attention / mesh.devices * block_passes(mesh.pipeline, repeats, microbatches, remat,
                                                            schedule) * recompute


FUSED_ATTENTION_RECOMPUTE = 7 / 6
"""A fused attention kernel (FlashAttention, cuDNN) keeps no probabilities for the backward, which
computes the scores (Q K^T) again: 14 t^2 d FLOPs per block and image instead of 12."""


def block_passes(stages: int, repeats: int, microbatches: int, remat: str, schedule: str = "circular") -> float:
    """Block FLOPs a device executes per block model FLOP (a forward and its backward: 3 forwards'
    worth). `full` remat runs each block's forward once more. A pipeline runs every stage in every
    iteration: circular (and Megatron-LM's 1F1B) v M + P - 1 iterations of forward and backward for
    v M passes; triskele's 1f1b a forward loop of v M + P - 1 iterations (one forward each) and a
    backward loop (`schedule_iterations`) whose iterations run the forward of one microbatch and the
    forward and backward of another (1 + 1 + 2: 3 forwards and a backward per pass in all)."""
    recompute = 1 if remat == "full" else 0
    if stages == 1:
        return (3 + recompute) / 3
    passes = repeats * microbatches
    forward = schedule_iterations(stages, repeats, microbatches)
    if schedule == "circular":
        return forward * (3 + recompute) / (3 * passes)
    backward = schedule_iterations(stages, repeats, microbatches, schedule) - forward
    return (forward + backward * (4 + recompute)) / (3 * passes)


def forward_flops(shape: ModelShape, records: int) -> StepFlops:
    images = records * shape.images_per_record
    embed = 2.0 * shape.patches * shape.patch_dim * shape.width
    return StepFlops(blocks=images * shape.depth * block_forward_flops(shape),
                     attention=images * shape.depth * attention_forward_flops(shape),
                     split=records * shape.head_split_flops,
                     replicated=images * embed + records * shape.head_flops)


def train_flops(shape: ModelShape, records: int) -> StepFlops:
    """Forward + backward of `records` records (model FLOPs: no rematerialisation counted)."""
    forward = forward_flops(shape, records)
    images = records * shape.images_per_record
    no_input_grad = images * 2.0 * shape.patches * shape.patch_dim * shape.width
    no_input_grad += records * shape.head_flops_without_input_grad
    return StepFlops(blocks=3.0 * forward.blocks, attention=3.0 * forward.attention, split=3.0 * forward.split,
                     replicated=3.0 * forward.replicated - no_input_grad)


def ring_all_reduce(devices: int, nbytes: float) -> float:
    return 2.0 * (devices - 1) / devices * nbytes if devices > 1 else 0.0


def all_gather(devices: int, gathered_bytes: float) -> float:
    """Bytes one device sends to gather an array of `gathered_bytes` from `devices` shards."""
    return (devices - 1) / devices * gathered_bytes if devices > 1 else 0.0


reduce_scatter = all_gather
"""Bytes one device sends to reduce-scatter an array of that many bytes (the same as gathering it)."""


@dataclasses.dataclass(frozen=True)
class ParamBytes:
    """A device's share of the parameters in bytes, as sharded and with the fsdp sharding undone
    (what an all-gather over fsdp produces), for the stacked blocks and for the rest."""

    blocks: float
    other: float
    blocks_fsdp_gathered: float
    other_fsdp_gathered: float

    @property
    def local(self) -> float:
        return self.blocks + self.other


def pipeline_block_gathers(stages: int, repeats: int, microbatches: int) -> int:
    """Times a pipeline stage's weights are gathered over fsdp per step when they are not gathered
    once: in every iteration of the schedule, for the forward and again for the backward."""
    return 2 * schedule_iterations(stages, repeats, microbatches)


@dataclasses.dataclass(frozen=True)
class StepCollectives:
    """Minimum bytes one device sends per training step, by what they are for."""

    data_all_reduce: float
    """Gradients summed over `data` (and over `pipeline` for what every stage holds whole), once per
    step at any `optim.grad_accum` (each data shard accumulates its own microbatches first)."""
    fsdp_all_gather: float
    """Weights gathered over `fsdp` once for the forward and backward; with a pipeline that does not
    gather once (`pipeline.gather_once=false`), each stage's weights twice (forward and backward) in
    each of the schedule's iterations."""
    fsdp_reduce_scatter: float
    """Gradients reduce-scattered over `fsdp`."""
    tensor_all_reduce: float
    """Megatron: two activation all-reduces per block forward, two backward, and one more where
    `full` remat recomputes the block (its attention output; the MLP output's all-reduce makes the
    block's output, which the backward does not need); the gradient entering the head's
    tensor-split layers."""
    tensor_all_gather: float
    """The outputs of the head's tensor-split layers, gathered for the layers that follow."""
    pipeline_permute: float
    """Microbatch activations passed to the next stage, forward and backward, every iteration."""
    pipeline_broadcast: float
    """The finished outputs sent from stage 0 to every stage, and the input gradients summed back."""

    @property
    def total(self) -> float:
        return sum(dataclasses.asdict(self).values())

    def by_kind(self) -> dict[str, float]:
        return {"all-reduce": self.data_all_reduce + self.tensor_all_reduce + self.pipeline_broadcast,
                "all-gather": self.fsdp_all_gather + self.tensor_all_gather,
                "reduce-scatter": self.fsdp_reduce_scatter, "collective-permute": self.pipeline_permute}


def step_collectives(
    shape: ModelShape,
    mesh: MeshSpec,
    global_batch: int,
    params: ParamBytes,
    activation_bytes: int,
    microbatches: int = 1,
    repeats: int = 1,
    remat: str = "dots",
    gather_once: bool = True,
) -> StepCollectives:
    records_local = global_batch // mesh.batch_shards
    activation = records_local * shape.images_per_record * shape.tokens * shape.width * activation_bytes
    per_block = 4 + (1 if remat == "full" else 0)
    tensor = per_block * shape.depth / mesh.pipeline * ring_all_reduce(mesh.tensor, activation)
    head_in = ring_all_reduce(mesh.tensor, records_local * shape.head_split_inputs * activation_bytes)
    head_out = all_gather(mesh.tensor, records_local * shape.head_split_outputs * activation_bytes)
    permute = broadcast = 0.0
    if mesh.pipeline > 1:
        permute = 2.0 * schedule_iterations(mesh.pipeline, repeats, microbatches) * activation / microbatches
        broadcast = 2.0 * ring_all_reduce(mesh.pipeline, activation)
    gathered = params.blocks_fsdp_gathered + params.other_fsdp_gathered
    block_gathers = 1 if gather_once or mesh.pipeline == 1 else pipeline_block_gathers(mesh.pipeline, repeats,
                                                                                       microbatches)
    return StepCollectives(
        data_all_reduce=ring_all_reduce(mesh.data, params.blocks)
        + ring_all_reduce(mesh.data * mesh.pipeline, params.other),
        fsdp_all_gather=all_gather(mesh.fsdp, params.other_fsdp_gathered)
        + block_gathers * all_gather(mesh.fsdp, params.blocks_fsdp_gathered),
        fsdp_reduce_scatter=reduce_scatter(mesh.fsdp, gathered),
        tensor_all_reduce=tensor + head_in,
        tensor_all_gather=head_out,
        pipeline_permute=permute,
        pipeline_broadcast=broadcast,
    )


def block_activation_elements(shape: ModelShape, images: int, tensor: int = 1) -> float:
    """Elements one block keeps for its backward, per device: the norm inputs and outputs (whole),
    Q, K, V and the attention output (split over heads), the score and probability matrices and
    the MLP's hidden activations before and after GELU (split over tensor)."""
    t, d, m, a = shape.tokens, shape.width, shape.mlp_dim, shape.heads
    whole = 4 * t * d
    split = 4 * t * d + 2 * t * m + 2 * a * t * t
    return images * (whole + split / tensor)


def dots_kept_bytes(shape: ModelShape, images: int, tensor: int, activation_bytes: int) -> float:
    """What a block keeps under the `dots` remat policy: the outputs of its matmuls (QKV, scores,
    attention-weighted values, MLP up: split over tensor; out projection, MLP down and the block
    input: whole)."""
    t, d, m, a = shape.tokens, shape.width, shape.mlp_dim, shape.heads
    return images * (3 * t * d + (4 * t * d + a * t * t + t * m) / tensor) * activation_bytes


PIPELINE_WEIGHT_TEMPORARIES = 2.0
"""Buffers of a device's parameter size that triskele's compiled step holds at its peak besides the
gradients, with a pipeline: read off XLA's buffer assignment of the train step (merch-tiny,
pipeline=4,data=2, M=4, CPU; `--xla_dump_to`): the gradients divided by the loss weight (`g /
weight`, live with the gradients while optax clips and updates) and a second copy of the stage's
gradient accumulator (the backward loop's carry and the buffer its update writes). The compiled
temporaries less the activations priced come to 3.0-3.3x the parameters at M = 4-16 under 1f1b
(2.9-3.3x circular at M = 4, 8); tests/test_pipeline_1f1b.py holds the totals within 20%."""
WEIGHT_TEMPORARIES = 0.5
"""The same without a pipeline, where the gradients come out of one backward: merch-tiny on data=8
measured 1.48x its parameters of temporaries beyond the activations priced (one measurement)."""


def weight_temporaries_on(mesh: MeshSpec) -> float:
    """Parameter-sized buffers triskele's compiled step holds besides the gradients on `mesh`."""
    return PIPELINE_WEIGHT_TEMPORARIES if mesh.pipeline > 1 else WEIGHT_TEMPORARIES


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """Bytes per device."""

    params: float
    gradients: float
    optimizer: float
    activations: float
    weight_temporaries: float = 0.0
    """Weight-sized buffers the compiled step holds at its peak besides the gradients
    (`step_memory`'s `weight_temporaries`)."""

    @property
    def total(self) -> float:
        return self.params + self.gradients + self.optimizer + self.activations + self.weight_temporaries


def step_memory(
    shape: ModelShape,
    mesh: MeshSpec,
    global_batch: int,
    params: ParamBytes,
    activation_bytes: int,
    remat: str,
    optimizer_moments: float = 2,
    records_alive: float | None = None,
    gather_once: bool = True,
    bounded_pipeline: tuple[int, int] | None = None,
    weight_temporaries: float | None = None,
) -> StepMemory:
    """Parameters, gradients and Adam's moments in float32 as sharded; activations saved for the
    backward of the device's layers (with `remat`, only each block's input, plus one block's worth
    recomputed at a time; `dots` keeps the matmul outputs only). `records_alive`: records whose
    activations are kept at once (default the device's whole batch; gradient accumulation keeps one
    microbatch, a 1F1B pipeline the microbatches in flight). A pipeline that gathers its weights
    once (`gather_once`) holds its stage's weights and their gradients whole over fsdp for the step.
    `bounded_pipeline`: (microbatches, repeats) of triskele's 1f1b schedule (`bounded_activations`).
    `weight_temporaries`: buffers of the device's parameter size the step holds besides the
    gradients (default triskele's compiled step's, `weight_temporaries_on(mesh)`)."""
    local = global_batch // mesh.batch_shards if records_alive is None else records_alive
    if bounded_pipeline is not None and mesh.pipeline > 1:
        activations = bounded_activations(shape, mesh, local, activation_bytes, remat, *bounded_pipeline)
    else:
        activations = _layer_activations(shape, local * shape.images_per_record, shape.depth / mesh.pipeline,
                                         mesh.tensor, activation_bytes, remat)
    gathered = params.blocks_fsdp_gathered - params.blocks if gather_once and mesh.pipeline > 1 else 0.0
    return StepMemory(
        params=params.local + gathered,
        gradients=params.local + gathered,
        optimizer=optimizer_moments * params.local,
        activations=activations,
        weight_temporaries=(weight_temporaries_on(mesh) if weight_temporaries is None else weight_temporaries)
        * params.local,
    )


def _layer_activations(shape: ModelShape, images: float, layers: float, tensor: int, activation_bytes: int,
                       remat: str) -> float:
    """What `layers` blocks keep for their backward under `remat`, plus one block recomputed at a time."""
    block = block_activation_elements(shape, images, tensor) * activation_bytes
    kept = {"none": block, "dots": dots_kept_bytes(shape, images, tensor, activation_bytes),
            "full": images * shape.tokens * shape.width * activation_bytes}[remat]
    return layers * kept + (block if remat != "none" else 0.0)


def bounded_activations(shape: ModelShape, mesh: MeshSpec, records: float, activation_bytes: int, remat: str,
                        microbatches: int, repeats: int) -> float:
    """Activation bytes per device of triskele's 1f1b schedule (`triskele.mesh.pipeline_1f1b`): its
    backward loop holds `ring_slots` stage inputs of one microbatch, one virtual stage's backward of
    one microbatch (its layers under `remat`), and three whole-batch arrays of a stage input's size:
    the pipeline's input (the custom VJP's residual), its output cotangent and the input cotangents
    it collects."""
    images = records * shape.images_per_record / microbatches
    stage_input = images * shape.tokens * shape.width * activation_bytes
    layers = shape.depth / (mesh.pipeline * repeats)
    waiting = ring_slots(mesh.pipeline, repeats, microbatches) + 3 * microbatches
    return waiting * stage_input + _layer_activations(shape, images, layers, mesh.tensor, activation_bytes, remat)


def activation_traffic_bytes(shape: ModelShape, images: float, tensor: int = 1, activation_bytes: int = 2,
                             probability_bytes: int = 4) -> float:
    """HBM bytes the blocks' forward moves besides the weights, per device, one pass per op (as
    hand-fused kernels run it): each matmul reads its input and writes its output; LayerNorm, GELU
    and the residual adds read and write theirs (22 t d + 4 t m elements per block and image, of
    which the LayerNorms' and residual adds' 10 t d are whole on every tensor device); the attention
    probabilities (4 a t^2: scores written, softmax read and written, read by the weighted sum) in
    `probability_bytes` (0 where a fused attention kernel keeps them on chip)."""
    t, d, m, a = shape.tokens, shape.width, shape.mlp_dim, shape.heads
    split = (12 * t * d + 4 * t * m) * activation_bytes + 4 * a * t * t * probability_bytes
    whole = 10 * t * d * activation_bytes
    return images * shape.depth * (split / tensor + whole)


XLA_PASSES = {"none": (152, 41, 16), "dots": (125, 25, 18), "full": (102, 21, 9)}
"""Passes over each activation of a block that one training step compiled by XLA makes outside the
matmuls, per image, by remat policy: (t x width arrays, t x mlp arrays, heads x t x t arrays), each
read or write of a whole array one pass, forward and backward, recomputation and the residuals the
scan saves (and zero-fills) included. Read off XLA:CPU's optimized HLO of deepfake-tiny's train step
(width 64, mlp 256, 4 heads, 8 blocks, float32) at 257 tokens: `hlo_counts.elementwise_bytes` per
instruction, grouped by the shape it moves. Against one pass per op (`activation_traffic_bytes`:
66, 12 and 12 passes under `dots`) XLA:CPU makes the softmax three passes, keeps the matmul outputs
`dots` saves in stacked buffers, and lays Q, K and V out again for the attention einsums.
tests/test_planner.py holds the whole term within 25% of the compiled step's at 65, 257 and 1,025
tokens. On a GPU XLA fuses at least as much: for a GPU these are an upper bound, not measured."""
WHOLE_PASSES_SHARE = 10 / 22
"""Share of the t x width passes on arrays every tensor device holds whole (LayerNorm, residual adds),
as in one pass per op."""
RUNTIMES = ("xla", "fused-kernels")
"""What runs the elementwise ops: XLA's compiled program (`XLA_PASSES`), or hand-fused kernels making
one pass per op (Megatron-LM, Transformer Engine: `activation_traffic_bytes` forward and twice
backward, again for what remat recomputes)."""
ATTENTIONS = ("fused", "xla")
"""How attention runs: a fused kernel (cuDNN, FlashAttention: the probabilities stay on chip and the
backward recomputes the scores) or as matmuls and a softmax through HBM."""


def training_traffic_bytes(shape: ModelShape, images: float, tensor: int = 1, activation_bytes: int = 2,
                           probability_bytes: int = 4, remat: str = "dots", runtime: str = "xla",
                           attention: str = "xla") -> float:
    """HBM bytes the blocks move outside the matmuls in one training step (forward and backward) on
    one pass over the layers, per device: by XLA's passes (`XLA_PASSES`) or one pass per op
    (`RUNTIMES`); the probabilities' passes only where attention runs outside a fused kernel."""
    if attention not in ATTENTIONS or runtime not in RUNTIMES:
        raise ValueError(f"attention {attention!r} / runtime {runtime!r}: use one of {ATTENTIONS} / {RUNTIMES}")
    probability_bytes = probability_bytes if attention == "xla" else 0
    if runtime == "fused-kernels":
        forward = activation_traffic_bytes(shape, images, tensor, activation_bytes, probability_bytes)
        return 3 * forward * block_passes(1, 1, 1, remat)
    t, d, m, a = shape.tokens, shape.width, shape.mlp_dim, shape.heads
    width, mlp, probabilities = XLA_PASSES[remat]
    whole = WHOLE_PASSES_SHARE * width * t * d * activation_bytes
    split = ((1 - WHOLE_PASSES_SHARE) * width * t * d + mlp * t * m) * activation_bytes \
        + probabilities * a * t * t * probability_bytes
    return images * shape.depth * (split / tensor + whole)
