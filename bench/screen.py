"""Screening videos: host core-seconds per video and what one H100 consumes, so cores per H100.

    python bench/screen.py --preset deepfake-b16 [--clips DIR] [--seconds 10] --json screen.json

Writes its own clips unless --clips gives a folder of them: H.264 (libx264, a keyframe every 2 s,
2 B-frames, as platforms re-encode uploads) at 640x480, 1280x720 and 1920x1080, `--seconds` long at
25 fps, the astronaut's face (scikit-image) moving across a grey room, a second smaller face, and a
cut halfway to another view. Each clip runs three ways, 32 frames a video:

- today: the whole stream decoded (OpenCV), dlib on each sampled frame (`--faces dlib --sample
  uniform --decode all`), all on the host;
- seek: only the sampled frames decoded (PyAV), BlazeFace on the device (`--faces blazeface`);
- keyframes: runs of frames from keyframes, each decoded frame kept (`--sample keyframes`).

Host work is process CPU time of the stages that stay on the host (demux and decode; for today's
path everything); the device stages (detect, crop) are timed here on this CPU for reference and
priced for an H100 from the planner: the classifier's inference roofline (bfloat16, batch 256) and
the detector's FLOPs as XLA counts them at the tensor-core rate times the GPU's efficiency (an
assumption: a depthwise convnet reaches less). `cores_per_h100` = host core-seconds per video x
H100 videos per second.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESOLUTIONS = ((640, 480), (1280, 720), (1920, 1080))
FRAMES_PER_VIDEO = 32
FPS = 25
PATHS = {"today": dict(faces="dlib", sample="uniform", decode="all"),
         "seek": dict(faces="blazeface", sample="uniform", decode="seek"),
         "keyframes": dict(faces="blazeface", sample="keyframes", decode="seek")}


def clip_frames(width: int, height: int, count: int) -> list[np.ndarray]:
    """The astronaut's face sliding across a grey room, a second face (half size) in a corner, and
    after half the frames a cut to the photograph seen whole."""
    from PIL import Image
    from skimage import data

    photo = data.astronaut()
    scale = height / 2 / 512
    face = np.asarray(Image.fromarray(photo).resize((int(512 * scale), int(512 * scale))))
    small = np.asarray(Image.fromarray(photo[40:220, 150:300]).resize((int(75 * scale * 2), int(90 * scale * 2))))
    whole = np.asarray(Image.fromarray(photo).resize((height * 512 // 512, height)))
    frames = []
    for i in range(count):
        frame = np.full((height, width, 3), 110, np.uint8)
        if i < count // 2:
            left = int((width - face.shape[1]) * i / max(count // 2 - 1, 1))
            frame[height // 4: height // 4 + face.shape[0], left: left + face.shape[1]] = face
            frame[height - small.shape[0] - 4: height - 4, 4: 4 + small.shape[1]] = small
        else:
            frame[:, (width - whole.shape[1]) // 2: (width - whole.shape[1]) // 2 + whole.shape[1]] = whole
        frames.append(frame)
    return frames


def write_clips(folder: Path, seconds: float) -> list[Path]:
    import av

    clips = []
    for width, height in RESOLUTIONS:
        path = folder / f"clip_{width}x{height}.mp4"
        with av.open(str(path), "w") as out:
            stream = out.add_stream("libx264", rate=FPS)
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            stream.options = {"g": str(2 * FPS), "bf": "2", "preset": "veryfast", "crf": "23"}
            for frame in clip_frames(width, height, int(seconds * FPS)):
                out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            out.mux(stream.encode())
        clips.append(path)
    return clips


def run_path(path: Path, how: dict) -> dict:
    """One clip one way: host CPU seconds and wall seconds by stage, frames decoded and kept."""
    from triskele.train.domains.deepfake import device_faces as device
    from triskele.train.domains.deepfake.faces import ENLARGE, _main_track, video_faces
    from triskele.train.domains.deepfake.video import sample_frames

    if how["faces"] == "dlib":
        cpu, wall = time.process_time(), time.perf_counter()
        faces = video_faces(path, FRAMES_PER_VIDEO, crops="box", **how)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        return {"host_core_s": cpu, "stages": {"decode+detect+crop (host)": wall},
                "frames_decoded": faces.frames_decoded, "frames_kept": faces.frames_sampled,
                "faces_found": len(faces.crops)}
    cpu, wall = time.process_time(), time.perf_counter()
    sampled = sample_frames(path, FRAMES_PER_VIDEO, sample=how["sample"], decode=how["decode"])
    stack = np.stack(sampled.frames)
    cpu, decode_s = time.process_time() - cpu, time.perf_counter() - wall
    start = time.perf_counter()
    found = device.device_faces(stack)
    detect_s = time.perf_counter() - start
    track = _main_track([[(box, score, None) for box, score in frame] for frame in found])
    boxes = [box for box in track if box is not None]
    start = time.perf_counter()
    if boxes:
        device.device_crops(stack[[i for i, box in enumerate(track) if box is not None]], boxes, 256, ENLARGE)
    crop_s = time.perf_counter() - start
    return {"host_core_s": cpu, "stages": {"demux+decode (host)": decode_s, "detect (device, this CPU)": detect_s,
                                          "crop (device, this CPU)": crop_s},
            "frames_decoded": sampled.decoded, "frames_kept": len(sampled.frames), "faces_found": len(boxes)}


def h100_seconds_per_video(preset: str, width: int, height: int) -> dict:
    """The device side of one video on an H100: 32 crops through the classifier (the planner's
    inference roofline, bfloat16, batch 256) and 32 frames through the detector (XLA's FLOPs)."""
    import jax
    from triskele.mesh.perf.hardware import get_gpu
    from triskele.mesh.perf.roofline import compute_peak, roofline
    from triskele.train.config.overrides import make_config
    from triskele.train.domains.deepfake import device_faces as device
    from triskele.train.tools.plan_inputs import abstract_model, parameter_count

    gpu = get_gpu("h100")
    model = abstract_model(make_config(preset, []))
    crops_per_s = roofline(model.shape, parameter_count(model, model.shape), gpu, "bfloat16", 256).images_per_sec
    detector = device.load_face_detector()
    frames = jax.ShapeDtypeStruct((1, height, width, 3), np.uint8)
    size = device.detector_size(width, height)
    compiled = jax.jit(lambda d, f: device.detect(d, f, size)).lower(detector, frames).compile()
    cost = compiled.cost_analysis()
    flops = float((cost[0] if isinstance(cost, list) else cost)["flops"])
    detect_s = FRAMES_PER_VIDEO * flops / (compute_peak(gpu, "bfloat16") * gpu.efficiency)
    classify_s = FRAMES_PER_VIDEO / crops_per_s
    return {"classifier_crops_per_s": crops_per_s, "detector_flops_per_frame": flops,
            "detector_input": size, "h100_videos_per_s": 1 / (detect_s + classify_s)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="deepfake-b16")
    parser.add_argument("--clips", type=Path, help="a folder of clips (default: written here)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the clips written (default 10)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    with tempfile.TemporaryDirectory() as folder:
        clips = sorted(args.clips.glob("*.mp4")) if args.clips else write_clips(Path(folder), args.seconds)
        rows = []
        for clip in clips:
            from triskele.train.domains.deepfake.seek import stream_index

            index = stream_index(clip)
            device_side = h100_seconds_per_video(args.preset, index.width, index.height)
            for name, how in PATHS.items():
                run_path(clip, how)  # compiles and warms caches; the second run is measured
                row = run_path(clip, how)
                row.update(clip=clip.name, path=name, **how, **device_side,
                           frames_decoded_per_frame_kept=row["frames_decoded"] / max(row["frames_kept"], 1),
                           videos_per_s_per_core=1 / row["host_core_s"],
                           cores_per_h100=row["host_core_s"] * device_side["h100_videos_per_s"])
                rows.append(row)
                print(f"{clip.name:24s} {name:10s} host {row['host_core_s']:.3f} core-s/video, "
                      f"decoded/kept {row['frames_decoded']}/{row['frames_kept']}, faces {row['faces_found']}, "
                      f"H100 {device_side['h100_videos_per_s']:.0f} videos/s -> {row['cores_per_h100']:.0f} cores",
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
