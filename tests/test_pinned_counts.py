"""Every named ViT size has the published shape and exactly the parameters a hand count gives
(`param_count(...) > 0` for every size let any size's table entry change).

The shapes are the papers' (Ti, S: DeiT, Touvron et al. 2021; B, L, H: Dosovitskiy et al. 2021;
g, G: Zhai et al. 2022, "Scaling Vision Transformers"; e: PaLI, Chen et al. 2023; 22B: Dehghani et
al. 2023), M as big_vision's table has it, tiny is the suite's own test size. The
count is worked out by hand from the architecture (pre-LN blocks with biased Q, K, V, out, MLP
up and down; a class token; learned position embeddings; a final LayerNorm; a linear head),
not from the model's code: a size whose width, depth or MLP changes, or a block that gains or
loses a parameter, changes it.
"""

import jax
import pytest
from flax import nnx
from triskele.models import VIT_SIZES, ViTClassifier, ViTConfig

PUBLISHED = {  # width, depth, MLP, heads
    "tiny": (64, 8, 256, 4),
    "Ti": (192, 12, 768, 3),
    "S": (384, 12, 1536, 6),
    "M": (512, 12, 2048, 8),
    "B": (768, 12, 3072, 12),
    "L": (1024, 24, 4096, 16),
    "H": (1280, 32, 5120, 16),
    "g": (1408, 40, 6144, 16),
    "G": (1664, 48, 8192, 16),
    "e": (1792, 56, 15360, 16),
    "22B": (6144, 48, 24576, 48),
}


def hand_count(width: int, depth: int, mlp: int, patch: int, image: int = 224, channels: int = 3,
               classes: int = 1000) -> int:
    d, tokens = width, (image // patch) ** 2 + 1  # the patches and the class token
    patch_embed = patch * patch * channels * d + d
    block = 2 * 2 * d + 4 * (d * d + d) + (d * mlp + mlp) + (mlp * d + d)  # 2 LayerNorms, Q K V out, MLP
    return patch_embed + d + tokens * d + depth * block + 2 * d + d * classes + classes


def param_count(cfg: ViTConfig, classes: int) -> int:
    model = nnx.eval_shape(lambda: ViTClassifier(cfg, classes, rngs=nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_the_hand_count_gives_the_published_deit_and_vit_counts():
    """The formula itself, against counts printed by the papers' code (timm's deit_tiny, deit_small,
    vit_base at 224 px, 1000 classes): the check that the count below is right."""
    assert hand_count(192, 12, 768, 16) == 5_717_416
    assert hand_count(384, 12, 1536, 16) == 22_050_664
    assert hand_count(768, 12, 3072, 16) == 86_567_656


def test_every_named_size_has_its_published_shape():
    assert {size: VIT_SIZES[size] for size in PUBLISHED} == PUBLISHED and set(VIT_SIZES) == set(PUBLISHED)


@pytest.mark.parametrize("patch", [14, 16])
def test_every_named_size_has_the_hand_counted_parameters(patch):
    for size, (width, depth, mlp, heads) in PUBLISHED.items():
        cfg = ViTConfig.named(size, patch=patch)
        assert (cfg.width, cfg.depth, cfg.mlp_dim, cfg.heads) == (width, depth, mlp, heads), size
        assert param_count(cfg, 1000) == hand_count(width, depth, mlp, patch), size
