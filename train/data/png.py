"""PNG files assembled by hand (signature, IHDR, one IDAT, IEND): the fast overlay encoder's output,
and the files with a header that promises more pixels than they hold (the decompression bomb's
shape) that the input limits are tested and benchmarked with; and the header facts PIL does not
report (bit depth, colour type, significant bits)."""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

SIGNATURE = b"\x89PNG\r\n\x1a\n"

COLOUR_TYPES = {1: 0, 3: 2}
"""Channels -> PNG colour type: grey (0) or RGB (2), 8 bits each."""


def png_file(width: int, height: int, channels: int, idat: bytes) -> bytes:
    """A PNG of `width` x `height` 8-bit pixels of 1 or 3 channels from its deflated, filtered
    scanlines `idat` (which may hold fewer rows than the header declares)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, COLOUR_TYPES[channels], 0, 0, 0)  # deflate, no interlace
    return SIGNATURE + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def header_only_png(width: int, height: int, rows: int = 2) -> bytes:
    """A grey PNG whose header declares width x height pixels and whose data stop after `rows`
    rows: a reader that decodes it fails ("cannot read"), one that checks the header first refuses
    it by its pixel count, the decompression bomb's defence."""
    return png_file(width, height, 1, zlib.compress(b"\x00" * (width + 1) * rows))


class PngDepth(NamedTuple):
    """A PNG's sample depth: `bits` per sample (IHDR), `colour_type` (0 grey, 2 RGB, 3 palette,
    4 grey + alpha, 6 RGBA) and `significant_bits`, the largest of the sBIT chunk's per-channel
    counts (None without one): a 12-bit camera's frame stored in 16 bits says 12 there."""

    bits: int
    colour_type: int
    significant_bits: int | None


def png_depth(head: bytes) -> PngDepth | None:
    """The depth of the PNG whose first bytes are `head` (the chunks before the first IDAT, where
    the specification puts sBIT); None for anything that is not a PNG."""
    if not head.startswith(SIGNATURE) or head[12:16] != b"IHDR" or len(head) < 26:
        return None
    bits, colour_type = head[24], head[25]
    offset, significant = 8, None
    while offset + 8 <= len(head):
        length, kind = struct.unpack(">I4s", head[offset:offset + 8])
        if kind in (b"IDAT", b"IEND"):
            break
        if kind == b"sBIT" and offset + 8 + length <= len(head):
            significant = max(head[offset + 8:offset + 8 + length], default=None)
        offset += 12 + length
    return PngDepth(bits, colour_type, significant)
