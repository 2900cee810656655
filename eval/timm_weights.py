"""`python -m triskele.eval export-weights`: a run's trained backbone as a timm safetensors file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
from triskele.mesh import make_mesh
from triskele.models.weights import to_timm
from triskele.train.backbone import vit_config
from triskele.train.run import restore_run
from triskele.train.weights.safetensors import write_safetensors

EXPORT_FORMATS = ("timm",)


def backbone_leaves(backbone: dict, prefix: str = "") -> dict[str, np.ndarray]:
    """Our backbone's leaves by path, fetched one at a time, blocks on one layer axis."""
    out = {}
    for key, value in backbone.items():
        if isinstance(value, dict):
            out.update(backbone_leaves(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = np.asarray(jax.device_get(value))
    return out


def export_weights(workdir: str | Path, fmt: str, output: str | Path, step: int | None = None,
                   mesh: str | None = None) -> dict[str, Any]:
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    parts, state, step = restore_run(Path(workdir), make_mesh(mesh or ""), step)
    if parts.config.model.quantization is not None:
        raise ValueError(f"{workdir} holds a {parts.config.model.quantization}-quantized checkpoint; export the "
                         "float checkpoint it was made from")
    cfg = vit_config(parts.config)
    leaves = backbone_leaves(state.params["backbone"])
    leaves = {k: v.reshape(cfg.depth, *v.shape[2:]) if k.startswith("blocks/") and cfg.pipeline_repeats > 1 else v
              for k, v in leaves.items()}
    tensors = to_timm(leaves, cfg.patch, cfg.channels)
    pooling = "global_pool='token'" if cfg.pool == "cls" else "class_token=False, global_pool='avg', fc_norm=False"
    metadata = {"format": "pt", "source": f"triskele {parts.config.preset} step {step}",
                "timm_model": f"VisionTransformer(img_size={cfg.image_size}, patch_size={cfg.patch}, "
                              f"in_chans={cfg.channels}, embed_dim={cfg.width}, depth={cfg.depth}, "
                              f"num_heads={cfg.heads}, mlp_ratio={cfg.mlp_dim / cfg.width:g}, {pooling}, "
                              f"num_classes=0)", "layer_norm_eps": repr(cfg.norm_eps)}
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    size = write_safetensors(output, tensors, metadata)
    return {"output": str(output), "format": fmt, "step": step, "tensors": len(tensors), "bytes": size,
            "timm_model": metadata["timm_model"]}
