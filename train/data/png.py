"""PNG files assembled by hand (signature, IHDR, one IDAT, IEND): the fast overlay encoder's output,
and the files with a header that promises more pixels than they hold (the decompression bomb's
shape) that the input limits are tested and benchmarked with."""

from __future__ import annotations

import struct
import zlib

COLOUR_TYPES = {1: 0, 3: 2}
"""Channels -> PNG colour type: grey (0) or RGB (2), 8 bits each."""


def png_file(width: int, height: int, channels: int, idat: bytes) -> bytes:
    """A PNG of `width` x `height` 8-bit pixels of 1 or 3 channels from its deflated, filtered
    scanlines `idat` (which may hold fewer rows than the header declares)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, COLOUR_TYPES[channels], 0, 0, 0)  # deflate, no interlace
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def header_only_png(width: int, height: int, rows: int = 2) -> bytes:
    """A grey PNG whose header declares width x height pixels and whose data stop after `rows`
    rows: a reader that decodes it fails ("cannot read"), one that checks the header first refuses
    it by its pixel count, the decompression bomb's defence."""
    return png_file(width, height, 1, zlib.compress(b"\x00" * (width + 1) * rows))
