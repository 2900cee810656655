"""Every pixel format is read as a person sees it: 16-bit frames scaled from their bit depth (not
clipped to white), EXIF orientation applied before anything else. Expected arrays are made by hand
here: the samples written, scaled by the range the format says; the stored layout of each EXIF
orientation from the EXIF specification's description of where row 0 and column 0 lie."""

from __future__ import annotations

import io
import struct
import zlib

import cv2
import numpy as np
import pytest
from PIL import Image
from triskele.models.preprocess import to_model_input
from triskele.train.data.images import EncodedImage, exif_orientation, image_size, open_image, read_image, read_mask

RAMP_12_BIT = (np.arange(48 * 64).reshape(48, 64) * 4095 // (48 * 64 - 1)).astype(np.uint16)
"""A 12-bit camera's frame as such cameras store it in 16 bits: 0..4095, unscaled."""


def png_bytes(pixels: np.ndarray, **save) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", **save)
    return buffer.getvalue()


def with_chunk(png: bytes, kind: bytes, body: bytes) -> bytes:
    """`png` with a chunk inserted right after IHDR (where sBIT and eXIf may stand)."""
    end_of_ihdr = 8 + 8 + 13 + 4
    chunk = struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return png[:end_of_ihdr] + chunk + png[end_of_ihdr:]


def sixteen_bit_rgb_png(rgb: np.ndarray) -> bytes:
    ok, encoded = cv2.imencode(".png", np.ascontiguousarray(rgb[..., ::-1]))
    assert ok
    return encoded.tobytes()


def exif_with_orientation(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def expected_8_bit(samples: np.ndarray, white: int) -> np.ndarray:
    return np.floor(samples.astype(np.float64) * 255 / white + 0.5).astype(np.uint8)


def read(data: bytes) -> np.ndarray:
    return np.asarray(open_image(EncodedImage(data, "test.png")))


def test_8_bit_grey_and_rgb_are_read_as_stored():
    rng = np.random.default_rng(0)
    grey = rng.integers(0, 256, (20, 30), dtype=np.uint8)
    rgb = rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)
    np.testing.assert_array_equal(read(png_bytes(grey)), grey)
    np.testing.assert_array_equal(read(png_bytes(rgb)), rgb)


def test_16_bit_grey_is_scaled_from_the_type_range_without_sbit():
    """No sBIT: the full 16 bits are white, so a 12-bit ramp reads dark (as any viewer shows it),
    never clipped to white as PIL's convert('L') does (99.6% of pixels at 255)."""
    pixels = read(png_bytes(RAMP_12_BIT))
    np.testing.assert_array_equal(pixels, expected_8_bit(RAMP_12_BIT, 65535))
    assert pixels.max() == 16 and (pixels == 255).mean() == 0
    full = (RAMP_12_BIT.astype(np.uint32) * 16).astype(np.uint16)
    np.testing.assert_array_equal(read(png_bytes(full)), expected_8_bit(full, 65535))


def test_16_bit_grey_with_sbit_12_is_scaled_from_12_bits():
    pixels = read(with_chunk(png_bytes(RAMP_12_BIT), b"sBIT", bytes([12])))
    np.testing.assert_array_equal(pixels, expected_8_bit(RAMP_12_BIT, 4095))
    assert pixels.min() == 0 and pixels.max() == 255


def test_sbit_with_samples_scaled_up_as_the_png_specification_asks_uses_16_bits():
    """Samples that exceed sBIT's range were scaled up to 16 bits by the writer: 65535 is white."""
    scaled_up = (RAMP_12_BIT.astype(np.uint32) << 4 | RAMP_12_BIT >> 8).astype(np.uint16)
    pixels = read(with_chunk(png_bytes(scaled_up), b"sBIT", bytes([12])))
    np.testing.assert_array_equal(pixels, expected_8_bit(scaled_up, 65535))


@pytest.mark.parametrize("sbit", [None, 12])
def test_16_bit_rgb_is_scaled_from_its_bit_depth(sbit):
    rgb = np.stack([RAMP_12_BIT, 4095 - RAMP_12_BIT, RAMP_12_BIT // 2], axis=-1).astype(np.uint16)
    data = sixteen_bit_rgb_png(rgb)
    if sbit:
        data = with_chunk(data, b"sBIT", bytes([sbit] * 3))
    image = open_image(EncodedImage(data, "rgb16.png"))
    assert image.mode == "RGB"
    np.testing.assert_array_equal(np.asarray(image), expected_8_bit(rgb, 4095 if sbit else 65535))


def test_in_memory_high_depth_images_reach_the_model_scaled():
    """Images handed to the preprocessing directly (not from a file): 16-bit and 32-bit integers by
    their type's range, floats as [0, 1]."""
    values = np.linspace(0, 1, 16 * 16).reshape(16, 16)
    cases = {"I;16": (values * 65535).round().astype(np.uint16), "I": (values * (2**31 - 1)).astype(np.int32),
             "F": values.astype(np.float32)}
    expected = np.floor(values * 255 + 0.5) / 255
    for mode, samples in cases.items():
        image = Image.fromarray(samples)
        assert image.mode == mode
        got = to_model_input(image, 16, 1)[..., 0]
        np.testing.assert_allclose(got, expected, atol=1 / 255 + 1e-6, err_msg=mode)


DISPLAYED = np.arange(2 * 3, dtype=np.uint8).reshape(2, 3) * 40 + 10
"""What a viewer shows: 2 rows, 3 columns, every value distinct."""

STORED = {
    1: DISPLAYED,
    2: DISPLAYED[:, ::-1],  # row 0 top, column 0 right
    3: DISPLAYED[::-1, ::-1],  # row 0 bottom, column 0 right
    4: DISPLAYED[::-1],  # row 0 bottom, column 0 left
    5: DISPLAYED.T,  # row 0 left side, column 0 top
    6: np.rot90(DISPLAYED, 1),  # row 0 right side, column 0 top
    7: np.rot90(DISPLAYED, 1)[:, ::-1],  # row 0 right side, column 0 bottom
    8: np.rot90(DISPLAYED, -1),  # row 0 left side, column 0 bottom
}
"""EXIF orientation -> the samples as a camera stores them (the specification's row 0 / column 0)."""


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_is_read_as_displayed(orientation):
    stored = np.ascontiguousarray(STORED[orientation])
    data = png_bytes(stored, exif=exif_with_orientation(orientation))
    source = EncodedImage(data, f"o{orientation}.png")
    assert exif_orientation(source) == orientation
    np.testing.assert_array_equal(np.asarray(open_image(source)), DISPLAYED)
    assert image_size(source) == (3, 2)


@pytest.mark.parametrize("orientation", [3, 6, 7])
def test_16_bit_rgb_is_turned_as_displayed(orientation):
    displayed = np.stack([DISPLAYED.astype(np.uint16) * 256] * 3, axis=-1)
    displayed[..., 1] = 65535 - displayed[..., 1]
    stored = np.ascontiguousarray(np.stack([STORED[orientation] for _ in range(3)], axis=-1).astype(np.uint16) * 256)
    stored[..., 1] = 65535 - stored[..., 1]
    data = with_chunk(sixteen_bit_rgb_png(stored), b"eXIf", exif_with_orientation(orientation)[6:])
    np.testing.assert_array_equal(np.asarray(open_image(EncodedImage(data, "t.png"))),
                                  expected_8_bit(displayed, 65535))


def test_a_phone_jpeg_turned_sideways_reads_upright(tmp_path):
    """A portrait shot stored landscape with orientation 6: read 400 wide and 600 tall, its top
    half (bright in the photo as shown) at the top, also in the model's centre square."""
    displayed = np.zeros((600, 400, 3), np.uint8)
    displayed[:300] = 250
    path = tmp_path / "phone.jpg"
    Image.fromarray(np.ascontiguousarray(np.rot90(displayed, 1))).save(path, exif=exif_with_orientation(6),
                                                                        quality=95)
    assert image_size(path) == (400, 600)
    pixels = np.asarray(open_image(path))
    assert pixels.shape == (600, 400, 3)
    assert pixels[:290].mean() > 240 and pixels[310:].mean() < 10
    frame = read_image(path, 60, 1)
    assert frame[:28].mean() > 0.9 and frame[32:].mean() < 0.05


def test_masks_keep_their_label_values_and_follow_their_orientation(tmp_path):
    """A label mask is never rescaled (16-bit labels stay 0..4) and is turned as its photo is."""
    labels = np.array([[0, 1, 2], [3, 4, 255]], np.uint16)
    path = tmp_path / "mask.png"
    path.write_bytes(png_bytes(np.ascontiguousarray(np.rot90(labels, 1)), exif=exif_with_orientation(6)))
    np.testing.assert_array_equal(read_mask(path), labels)


def test_the_model_input_of_a_16_bit_frame_matches_its_8_bit_twin(tmp_path):
    """The same picture stored in 8 bits and in 16 bits (scaled up): the same model input, to 1/255."""
    rng = np.random.default_rng(1)
    eight = rng.integers(0, 256, (64, 64), dtype=np.uint8)
    (tmp_path / "8.png").write_bytes(png_bytes(eight))
    (tmp_path / "16.png").write_bytes(png_bytes(eight.astype(np.uint16) * 257))
    a, b = read_image(tmp_path / "8.png", 32, 1), read_image(tmp_path / "16.png", 32, 1)
    np.testing.assert_allclose(a, b, atol=1 / 255 + 1e-6)
