"""Decoding only the sampled frames: the frames a seek-and-decode keeps equal, byte for byte, the
frames a whole-stream decode keeps at the same indices, on H.264 with B-frames and open GOPs, an
MPEG-4 stream and a header that lies; keyframe sampling decodes each frame it keeps once."""

import numpy as np
import pytest
from videoutil import pan, write_h264, write_video

pytest.importorskip("av", reason="seeking needs PyAV")

from triskele.train.config.schema import InputLimits  # noqa: E402
from triskele.train.domains.deepfake import seek  # noqa: E402
from triskele.train.domains.deepfake.video import sample_frames  # noqa: E402


def _same(a, b) -> bool:
    return a.indices == b.indices and len(a.frames) == len(b.frames) and all(
        np.array_equal(x, y) for x, y in zip(a.frames, b.frames, strict=True))


@pytest.mark.parametrize("gop, bframes, open_gop", [(12, 2, False), (12, 3, True), (30, 0, False)])
def test_seeking_keeps_the_frames_a_full_decode_keeps(tmp_path, gop, bframes, open_gop):
    video = write_h264(tmp_path / "v.mp4", pan(61), gop=gop, bframes=bframes, open_gop=open_gop)
    index = seek.stream_index(video)
    assert len(index.timestamps) == 61 and [k for k, key in enumerate(index.keyframes) if key] == list(
        range(0, 61, gop))
    for count in (5, 16):
        full, sought = sample_frames(video, count, decode="all"), sample_frames(video, count)
        assert _same(full, sought) and full.total == sought.total == 61
        assert sought.decoded < full.decoded == 61  # the frames after the last sampled one are never decoded


def test_each_kept_frame_is_decoded_from_its_own_keyframe(tmp_path):
    """Frames 0, 24 and 48 of a stream with a keyframe every 12 frames: three keyframes, three
    decodes; a seek offset one frame off decodes (or keeps) other frames."""
    video = write_h264(tmp_path / "v.mp4", pan(49), gop=12, bframes=0)
    index = seek.stream_index(video)
    kept = seek.decode_at(video, index, [0, 24, 48], InputLimits(), lambda frame: frame)
    full = sample_frames(video, 49, decode="all")
    assert kept[0] == [0, 24, 48] and kept[2] == 3
    assert all(np.array_equal(frame, full.frames[i]) for i, frame in zip(kept[0], kept[1], strict=True))
    assert seek.decode_at(video, index, [30], InputLimits(), lambda frame: frame)[2] == 7  # frames 24..30


def test_keyframe_sampling_decodes_each_frame_it_keeps_once(tmp_path):
    video = write_h264(tmp_path / "v.mp4", pan(96), gop=12, bframes=0)
    sampled = sample_frames(video, 16, sample="keyframes")
    assert sampled.indices == [k + d for k in range(0, 96, 12) for d in (0, 1)] and sampled.decoded == 16
    assert _same(sampled, type(sampled)(sampled.indices, [sample_frames(video, 96, decode="all").frames[i]
                                                          for i in sampled.indices], 96, 96))


def test_an_mpeg4_stream_and_a_lying_header_give_the_full_decode_s_frames(tmp_path, monkeypatch):
    video = write_video(tmp_path / "v.mp4", pan(40))
    assert _same(sample_frames(video, 7, decode="all"), sample_frames(video, 7))
    import av

    opened = av.open

    def lying(*args, **kwargs):  # the header says 25 frames where the stream holds 40
        container = opened(*args, **kwargs)
        type(container.streams.video[0]).frames = property(lambda self: 25)
        return container

    monkeypatch.setattr(av, "open", lying)
    assert seek._open(video, InputLimits())[1].frames == 25
    sought = sample_frames(video, 7)
    assert sought.total == 40 and sought.indices == np.linspace(0, 39, 7).round().astype(int).tolist()


def test_seeking_refuses_a_stream_past_the_frame_limit_and_a_truncated_file_names_it(tmp_path):
    video = write_h264(tmp_path / "v.mp4", pan(30), gop=10)
    with pytest.raises(ValueError, match=rf"^cannot read video {video}: its (header declares|stream holds at least) "
                                         r"\d+ frames, over limits.video_frames=20"):
        sample_frames(video, 4, InputLimits(video_frames=20))
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(video.read_bytes()[:300])
    with pytest.raises(ValueError, match=rf"^cannot read video {cut}"):
        sample_frames(cut, 4)
    with pytest.raises(ValueError, match=r"--sample 'every': choose uniform or keyframes"):
        sample_frames(video, 4, sample="every")
