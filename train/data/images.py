"""Reading images and masks from disk, with errors that name the file; what the pixels then become
is `triskele.models.preprocess`.

Every reader of every domain opens its files here: only the formats listed (`IMAGE_FORMATS`) are
opened, and an image whose header declares more pixels than `limits.image_pixels` is refused
before a pixel is decoded (`triskele.train.config.InputLimits`). Anything else that goes wrong
while decoding one file is a ValueError naming it, which predict lists in errors.csv and
`data.bad_records=skip` skips.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
from PIL import Image
from triskele.models.preprocess import to_model_input
from triskele.train.config import InputLimits

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".JPG", ".JPEG", ".PNG")
IMAGE_FORMATS = ("PNG", "JPEG")
"""The formats (PIL's names) an image file of any domain may hold, whatever its suffix: no other
decoder is ever run on an input."""
_SIGNATURES = {b"II*\x00": "TIFF", b"MM\x00*": "TIFF", b"GIF87a": "GIF", b"GIF89a": "GIF", b"BM": "BMP",
               b"\x00\x00\x01\x00": "ICO", b"8BPS": "PSD", b"\x97JB2": "JBIG2", b"\x00\x00\x00\x0cjP": "JPEG 2000",
               b"\xff\x4f\xff\x51": "JPEG 2000", b"qoif": "QOI"}
"""Leading bytes of formats that are refused, so that the refusal can say what the file is."""



class EncodedImage:
    """An image file's bytes held in memory (an image sent to the server, or the planogram sent with
    a shelf photo), which every reader here opens as it opens a file, with the same checks: a
    domain's reader takes it where it takes a path.
    `name` is what errors call it; `suffix` is empty (it is no video)."""

    suffix = ""

    def __init__(self, data: bytes, name: str):
        self.data, self.name = bytes(data), name

    def __str__(self) -> str:
        return self.name


ImageSource = Path | EncodedImage
"""A file, or an image's bytes (`EncodedImage`)."""


def _stream(source: ImageSource) -> Path | io.BytesIO:
    """What PIL opens: the file, or a fresh stream over the bytes."""
    return io.BytesIO(source.data) if isinstance(source, EncodedImage) else source


def _head(source: ImageSource, size: int) -> bytes:
    if isinstance(source, EncodedImage):
        return source.data[:size]
    with open(source, "rb") as f:
        return f.read(size)


# The limit is ours (`_opened` refuses every image over it with its own reason), so PIL's warning
# for an image between Image.MAX_IMAGE_PIXELS and twice that says nothing more.
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


def _unreadable(path: ImageSource, err: Exception | str) -> ValueError:
    """The reader's error naming the file; a 0-byte file (an interrupted copy, say) is called empty,
    which PIL's 'cannot identify image file' does not say."""
    if isinstance(path, EncodedImage):
        empty = not path.data
    else:
        empty = Path(path).is_file() and Path(path).stat().st_size == 0
    return ValueError(f"cannot read image {path}: {'empty file (0 bytes)' if empty else err}")


def _reason(err: Exception) -> str:
    """What a reader's exception says: the message of PIL's usual errors, the type's name beside any other's."""
    return str(err) if isinstance(err, OSError | ValueError) else f"{type(err).__name__}: {err}"


def _format_of(path: ImageSource) -> str | None:
    """The name of a refused format the file's first bytes show (None: none known)."""
    head = _head(path, 12)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    return next((name for magic, name in _SIGNATURES.items() if head.startswith(magic)), None)


def _not_listed(path: ImageSource, formats: tuple[str, ...]) -> str:
    found = _format_of(path)
    what = f"a {found} file" if found else "not an image of a format read here"
    if isinstance(path, EncodedImage):
        return f"{what}; only {' and '.join(formats)} images are read"
    return f"{what} (named {Path(path).suffix or 'without a suffix'}); only {' and '.join(formats)} images are read"


def _opened(path: ImageSource, limits: InputLimits | None, formats: tuple[str, ...]) -> Image.Image:
    """The image with its header read and checked (format, pixels), no pixel decoded yet."""
    limits = limits or InputLimits()
    Image.MAX_IMAGE_PIXELS = limits.image_pixels  # PIL refuses twice that itself, before our check
    try:
        image = Image.open(_stream(path), formats=list(formats))
    except Image.DecompressionBombError:
        amount = f"its header declares more than {2 * limits.image_pixels:,} pixels"
        raise _unreadable(path, limits.over("image_pixels", amount)) from None
    except Image.UnidentifiedImageError:
        raise _unreadable(path, _not_listed(path, formats)) from None
    except Exception as err:  # noqa: BLE001 - any failure to read one file's header is that file's error
        raise _unreadable(path, _reason(err)) from None
    width, height = image.size
    try:
        limits.check("image_pixels", width * height, f"cannot read image {path}: {width}x{height} =")
    except ValueError:
        image.close()
        raise
    return image


def open_image(path: ImageSource, limits: InputLimits | None = None, formats: tuple[str, ...] = IMAGE_FORMATS
               ) -> Image.Image:
    """The decoded image; ValueError naming the file if it is not one of `formats`, declares more
    pixels than `limits.image_pixels` (both checked before decoding) or does not decode."""
    image = _opened(path, limits, formats)
    try:
        image.load()
    except Exception as err:  # noqa: BLE001 - a decoder's failure on one crafted file is that file's error
        image.close()
        raise _unreadable(path, _reason(err)) from None
    return image


def image_size(path: ImageSource, limits: InputLimits | None = None) -> tuple[int, int]:
    """(width, height) from the file header, checked as `open_image` checks it, without decoding the pixels."""
    with _opened(path, limits, IMAGE_FORMATS) as image:
        return image.size


def read_image(path: ImageSource, size: int, channels: int, limits: InputLimits | None = None) -> np.ndarray:
    """The model input of an image file: (size, size, channels) float32 in [0, 1]."""
    return to_model_input(open_image(path, limits), size, channels)


def read_mask(path: Path, like: Path | None = None, limits: InputLimits | None = None) -> np.ndarray:
    """A single-channel uint8 mask at its own resolution; `like` is an image it must match in size."""
    mask = open_image(path, limits)
    if mask.mode not in ("L", "P", "1", "I", "I;16"):
        mask = mask.convert("L")
    if like is not None:
        expected = image_size(like, limits)
        if mask.size != expected:
            raise ValueError(f"mask {path} is {mask.size[0]}x{mask.size[1]} but its image {like} is "
                             f"{expected[0]}x{expected[1]}; masks must match their image's size")
    return np.asarray(mask).astype(np.int64)
