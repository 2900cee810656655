"""What the serving routes share: the model's decoder and batcher, the metrics, the pools, the
options and whether the server is ready (`ServeState`)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any

from triskele.eval.defaults import ServeOptions
from triskele.eval.serving.batcher import Batcher
from triskele.eval.serving.inputs import Decoder
from triskele.eval.serving.metrics import ServeMetrics

ENCODE_THREADS = 2


@dataclasses.dataclass
class ServeState:
    """What the routes share; `ready` turns on after warm-up and off again for the drain."""

    name: str
    decoder: Decoder
    batcher: Batcher
    metrics: ServeMetrics
    decode_pool: concurrent.futures.Executor
    """Parsing and decoding requests (`--threads`)."""
    config: dict[str, Any]
    """The Triton-style model configuration (`/config`)."""
    metadata: dict[str, Any]
    options: ServeOptions = dataclasses.field(default_factory=ServeOptions)
    token: str | None = None
    ready: bool = False
    draining: bool = False
    encode_pool: concurrent.futures.Executor = dataclasses.field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(ENCODE_THREADS, "triskele-encode"))
    """Encoding answers, apart from decoding: a burst of large uploads does not hold answers back."""
    in_flight: int = 0
    """Infer requests arrived whose response is not sent yet (`Admission`; the drain waits for them)."""

    def close_pools(self) -> None:
        """Ends the decoding and encoding threads once their current work is done; what is queued is dropped."""
        for pool in (self.decode_pool, self.encode_pool):
            pool.shutdown(wait=False, cancel_futures=True)
