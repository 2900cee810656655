"""JAX's persistent compilation cache, on by default so reruns and multi-host starts skip compiling."""

from __future__ import annotations

import os
from pathlib import Path

import jax

DEFAULT_CACHE_DIR = Path(os.environ.get("TRISKELE_CACHE_DIR", Path.home() / ".cache" / "triskele" / "jax"))


def enable_compilation_cache(cache_dir: str | os.PathLike | None = None) -> Path | None:
    """Turns the cache on in `cache_dir` (default ~/.cache/triskele/jax); '' or 'off' turns it off."""
    path = DEFAULT_CACHE_DIR if cache_dir is None else cache_dir
    if str(path) in ("", "off"):
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    path = Path(path).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
