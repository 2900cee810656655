"""Defaults of the inference commands that their `--help` names, in a module that imports nothing
(no JAX): `triskele.eval.model` re-exports them beside the code that applies them."""

import dataclasses
from pathlib import Path

INFERENCE_BATCH_PER_DEVICE = 8
"""predict's default batch: this many records per device on `data x fsdp` (never the training batch)."""


SERVE_LIMITS = {"image_pixels": 12_000_000, "frame_pixels": 1920 * 1080, "video_frames": 9000}
"""serve's own input limits, below predict's (`InputLimits`): a request's image at most 12
megapixels, its videos' frames at most 1920x1080 and 9,000 (5 minutes at 30 fps), so that the
threads decoding requests at once hold bounded memory; `--set limits.KEY=N` overrides them."""


@dataclasses.dataclass
class ServeOptions:
    """How `serve` runs (its flags, by name)."""

    host: str = "127.0.0.1"
    port: int = 8000
    name: str | None = None
    """The model's name in the routes (default: the run's domain)."""
    max_batch: int = 32
    max_delay_ms: float = 5.0
    max_queue: int = 256
    """Requests waiting at most; one more is a 503 with Retry-After."""
    max_in_flight: int = 64
    """Infer requests arrived and not answered yet at most; one more is a 503 before its body is read."""
    max_images: int = 64
    """Elements of a BYTES input (images, videos, planograms) a request at most, checked from its shape."""
    max_records: int = 256
    """Records a request at most once decoded (images, tiles of large photos, sampled video frames)."""
    timeout_seconds: float = 30.0
    max_body_bytes: int = 64 << 20
    token_file: Path | None = None
    threads: int = 4
    """Decoding threads."""
    drain_seconds: float = 30.0
