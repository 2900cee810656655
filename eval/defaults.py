"""Defaults of the inference commands that their `--help` names, in a module that imports nothing
(no JAX): `triskele.eval.model` re-exports them beside the code that applies them."""

import dataclasses
from pathlib import Path
from typing import Any

INFERENCE_BATCH_PER_DEVICE = 8
"""predict's default batch: this many records per device on `data x fsdp` (never the training batch)."""


SERVE_LIMITS = {"image_pixels": 12_000_000, "frame_pixels": 1920 * 1080, "video_frames": 9000}
"""serve's own input limits, below predict's (`InputLimits`): a request's image at most 12
megapixels, its videos' frames at most 1920x1080 and 9,000 (5 minutes at 30 fps), so that the
threads decoding requests at once hold bounded memory; `--set limits.KEY=N` overrides them."""


def _flag(default: Any, help: str, low: float | None = None, high: float | None = None) -> Any:
    """A field that is also a command-line flag: its help, and for a number the range it accepts."""
    return dataclasses.field(default=default, metadata={"help": help, "low": low, "high": high})


@dataclasses.dataclass
class ServeOptions:
    """How `serve` runs: each field is its flag (`max_batch` is `--max-batch`), generated from here
    (`triskele.train.commands.add_dataclass_flags`)."""

    host: str = _flag("127.0.0.1", "address to bind (default %(default)s: this machine only)")
    port: int = _flag(8000, "port (default %(default)s)", 0, 65535)
    name: str | None = _flag(None, "the model's name in the routes (default: the run's domain)")
    max_batch: int = _flag(32, "largest batch compiled; sizes are data x fsdp devices times 1, 2, 4, ... up to it "
                               "(default %(default)s)", 1)
    max_delay_ms: float = _flag(5.0, "longest a request waits for others to batch with (default %(default)s)", 0)
    max_queue: int = _flag(256, "requests waiting at most; more get 503 with Retry-After (default %(default)s)", 1)
    max_in_flight: int = _flag(64, "infer requests arrived and not answered yet at most; more get 503 before their "
                                   "body is read (default %(default)s)", 1)
    max_images: int = _flag(64, "elements of a BYTES input (images, videos, planograms) a request at most; more is "
                                "413, checked from its shape (default %(default)s)", 1)
    max_records: int = _flag(256, "records a request makes at most once decoded (images, tiles of large photos, "
                                  "sampled video frames); more is 413 (default %(default)s)", 1)
    timeout_seconds: float = _flag(30.0, "a request's deadline; later is 504 (default %(default)s)", 0.001)
    max_body_bytes: int = _flag(64 << 20, "largest request body; larger is 413 (default %(default)s)", 1)
    token_file: Path | None = _flag(None, "a file holding the bearer token the model and infer routes require")
    threads: int = _flag(4, "threads decoding requests (default %(default)s)", 1)
    drain_seconds: float = _flag(30.0, "on SIGTERM, time to answer the requests accepted before exiting "
                                       "(default %(default)s)", 0)
