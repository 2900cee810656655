"""Reading images and masks from disk, with errors that name the file; what the pixels then become
is `triskele.models.preprocess`.

Every reader of every domain opens its files here, and sees each picture as a person does: turned
by its EXIF orientation (a phone's portrait stored sideways), and a 16-bit frame scaled from its
bit depth rather than clipped to white. Only the formats listed (`IMAGE_FORMATS`) are opened, and
an image whose header declares more pixels than `limits.image_pixels` is refused before a pixel
is decoded (`triskele.train.config.schema.InputLimits`). Anything else that goes wrong
while decoding one file is a ValueError naming it, which predict lists in errors.csv and
`data.bad_records=skip` skips.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
from PIL import ExifTags, Image, ImageOps
from triskele.models.preprocess import eight_bit, frame_pixels, frame_size, scaled_to_8_bit, to_model_input
from triskele.train.config.schema import InputLimits
from triskele.train.data.png import png_depth

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


def _not_listed(path: ImageSource, formats: tuple[str, ...], also_read: str = "") -> str:
    found = _format_of(path)
    what = f"a {found} file" if found else "not an image of a format read here"
    read = f"only {' and '.join(formats)} images{also_read} are read"
    if isinstance(path, EncodedImage):
        return f"{what}; {read}"
    return f"{what} (named {Path(path).suffix or 'without a suffix'}); {read}"


def _opened(path: ImageSource, limits: InputLimits | None, formats: tuple[str, ...], also_read: str = ""
            ) -> Image.Image:
    """The image with its header read and checked (format, pixels), no pixel decoded yet."""
    limits = limits or InputLimits()
    Image.MAX_IMAGE_PIXELS = limits.image_pixels  # PIL refuses twice that itself, before our check
    try:
        image = Image.open(_stream(path), formats=list(formats))
    except Image.DecompressionBombError:
        amount = f"its header declares more than {2 * limits.image_pixels:,} pixels"
        raise _unreadable(path, limits.over("image_pixels", amount)) from None
    except Image.UnidentifiedImageError:
        raise _unreadable(path, _not_listed(path, formats, also_read)) from None
    except Exception as err:  # noqa: BLE001 - any failure to read one file's header is that file's error
        raise _unreadable(path, _reason(err)) from None
    width, height = image.size
    try:
        limits.check("image_pixels", width * height, f"cannot read image {path}: {width}x{height} =")
    except ValueError:
        image.close()
        raise
    return image


_TURNED = (5, 6, 7, 8)
"""EXIF orientations that swap width and height (a quarter turn, with or without a mirror)."""


def _orientation(image: Image.Image) -> int:
    """The EXIF orientation (1-8) of an opened image, from its header (a JPEG's APP1, a PNG's eXIf
    chunk before the pixels; `getexif` would decode a PNG whole to look after them); 1 (as stored)
    without one, or for EXIF that does not parse or a value outside 1-8."""
    raw = image.info.get("exif")
    if not raw:
        return 1
    exif = Image.Exif()
    try:
        exif.load(raw)
        orientation = exif.get(ExifTags.Base.Orientation, 1)
    except Exception:  # noqa: BLE001 - damaged EXIF is no orientation, never an unreadable image
        return 1
    return orientation if orientation in range(1, 9) else 1


def exif_orientation(path: ImageSource, limits: InputLimits | None = None) -> int:
    """The EXIF orientation the readers apply to the file (1: none), from its header."""
    with _opened(path, limits, IMAGE_FORMATS) as image:
        return _orientation(image)


_ORIENTED = {2: lambda a: a[:, ::-1], 3: lambda a: a[::-1, ::-1], 4: lambda a: a[::-1],
             5: lambda a: a.swapaxes(0, 1), 6: lambda a: np.rot90(a, -1), 7: lambda a: a[::-1, ::-1].swapaxes(0, 1),
             8: lambda a: np.rot90(a, 1)}
"""EXIF orientation -> the array (rows, columns, ...) as displayed: what `ImageOps.exif_transpose`
does to a PIL image, for samples that PIL cannot hold (16-bit colour)."""


def exif_note(path: ImageSource) -> dict[str, int]:
    """`{"exif_orientation": N}` for an image that the readers turn by its EXIF orientation N (2-8),
    which an output carries to say it is as the photo is displayed, not as it is stored; `{}` for
    any other input (a video, an image without one, a file that no longer reads)."""
    if isinstance(path, Path) and path.suffix not in IMAGE_SUFFIXES:
        return {}
    try:
        orientation = exif_orientation(path)
    except ValueError:
        return {}
    return {"exif_orientation": orientation} if orientation != 1 else {}


def _decoded(path: ImageSource, limits: InputLimits | None, formats: tuple[str, ...], also_read: str = "",
             reduce_to: float = 1.0) -> tuple[Image.Image, int]:
    """The decoded image, samples and orientation as stored, and its EXIF orientation. A JPEG is
    decoded at `reduce_to` of its size or the next power-of-2 reduction above it (PIL's `draft`:
    libjpeg scales in the DCT, skipping most of the work of a full decode)."""
    image = _opened(path, limits, formats, also_read)
    try:
        if reduce_to < 1 and image.format == "JPEG":
            image.draft(image.mode, frame_size(*image.size, reduce_to))
        image.load()
        return image, _orientation(image)
    except Exception as err:  # noqa: BLE001 - a decoder's failure on one crafted file is that file's error
        image.close()
        raise _unreadable(path, _reason(err)) from None


def _turned(image: Image.Image, orientation: int) -> Image.Image:
    return ImageOps.exif_transpose(image) if orientation != 1 else image


def _sixteen_bit_colour(path: ImageSource) -> np.ndarray:
    """A 16-bit RGB(A) PNG's samples (rows, columns, 3 or 4) as stored: PIL keeps only their high
    byte, so OpenCV decodes them."""
    import cv2

    data = path.data if isinstance(path, EncodedImage) else Path(path).read_bytes()
    stored = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if stored is None or stored.dtype != np.uint16 or stored.ndim != 3:
        raise _unreadable(path, "a 16-bit colour PNG that does not decode as 16 bits")
    return stored[..., [2, 1, 0, 3][: stored.shape[-1]]]


def _white(samples: np.ndarray, significant_bits: int | None) -> int:
    """The 16-bit sample value shown as white: sBIT's maximum where every sample fits in its
    significant bits (a 12-bit camera's values stored as they are), 65535 otherwise (samples scaled
    up to 16 bits, as the PNG specification asks)."""
    if significant_bits is not None and significant_bits < 16 and samples.max() < (1 << significant_bits):
        return (1 << significant_bits) - 1
    return 65535


def open_image(path: ImageSource, limits: InputLimits | None = None, formats: tuple[str, ...] = IMAGE_FORMATS,
               also_read: str = "") -> Image.Image:
    """The decoded image as a person sees it: turned by its EXIF orientation, and a 16-bit PNG in 8
    bits scaled from its bit depth (`_white`); 8-bit images as stored. ValueError naming the file if
    it is not one of `formats`, declares more pixels than `limits.image_pixels` (both checked before
    decoding) or does not decode; the refusal of another format names `also_read` too (what else the
    caller reads: " and MP4 ... videos")."""
    return _as_seen(*_decoded(path, limits, formats, also_read), path)


def _as_seen(image: Image.Image, orientation: int, path: ImageSource) -> Image.Image:
    """A decoded image turned by its EXIF orientation, a 16-bit PNG scaled to 8 bits (`open_image`)."""
    depth = png_depth(_head(path, 1 << 16)) if image.format == "PNG" else None
    if depth is None or depth.bits != 16 or depth.colour_type not in (0, 2, 6):
        return eight_bit(_turned(image, orientation))
    if depth.colour_type == 0:
        samples = np.asarray(_turned(image, orientation))
    else:
        samples = _ORIENTED.get(orientation, lambda a: a)(_sixteen_bit_colour(path))
    mode = {0: "L", 2: "RGB", 6: "RGBA"}[depth.colour_type]
    return Image.fromarray(scaled_to_8_bit(samples, _white(samples, depth.significant_bits)), mode)


def read_frame(path: ImageSource, scale: float, channels: int, limits: InputLimits | None = None) -> np.ndarray:
    """A whole frame at `scale` as uint8 (`preprocess.frame_pixels`), a JPEG decoded at reduced
    size where the frame is smaller than the file (`_decoded`'s draft), then resized to the exact
    frame size as any other file is."""
    width, height = image_size(path, limits)
    picture = _as_seen(*_decoded(path, limits, IMAGE_FORMATS, reduce_to=scale), path)
    return frame_pixels(picture, frame_size(width, height, scale), channels)


def image_size(path: ImageSource, limits: InputLimits | None = None) -> tuple[int, int]:
    """(width, height) as displayed (after the EXIF orientation) from the file header, checked as
    `open_image` checks it, without decoding the pixels."""
    with _opened(path, limits, IMAGE_FORMATS) as image:
        width, height = image.size
        return (height, width) if _orientation(image) in _TURNED else (width, height)


def read_image(path: ImageSource, size: int, channels: int, limits: InputLimits | None = None) -> np.ndarray:
    """The model input of an image file: (size, size, channels) float32 in [0, 1]."""
    return to_model_input(open_image(path, limits), size, channels)


def read_mask(path: Path, like: Path | None = None, limits: InputLimits | None = None,
              like_size: tuple[int, int] | None = None) -> np.ndarray:
    """A single-channel mask at its own resolution (uint8 for 1- and 8-bit files, int64 for deeper
    ones); `like` is an image it must match in size (`like_size`, its size where the caller has
    read it already)."""
    mask = _turned(*_decoded(path, limits, IMAGE_FORMATS))
    if mask.mode not in ("L", "P", "1", "I", "I;16"):
        mask = mask.convert("L")
    if like is not None:
        expected = like_size or image_size(like, limits)
        if mask.size != expected:
            raise ValueError(f"mask {path} is {mask.size[0]}x{mask.size[1]} but its image {like} is "
                             f"{expected[0]}x{expected[1]}; masks must match their image's size")
    values = np.asarray(mask)
    return values.astype(np.uint8) if values.dtype in (np.uint8, np.bool_) else values.astype(np.int64)
