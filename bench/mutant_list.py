"""The behavioural mutants `bench/mutants.py` runs (issue 38): each a one-line bug in one named function
and the tests that must fail on it.

To add one, append an entry to MUTANTS:

    Mutant("short-name", "path/to/file.py", "Class.method",  # or "function", or "outer.inner"
           "exact original text",  # must occur exactly once in the file, inside that function
           "its replacement",
           ("tests/test_x.py::test_y",),  # node ids or test files; `k="..."` adds a -k expression
           "the bug in words, and what catches it"),

then run `python bench/mutants.py --only short-name`: it must report `killed`. Keep each selection to
the fewest, fastest tests that kill it (they run with -x, in one process).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    """Relative to the repository root."""
    function: str
    """The def the change lies in: its name, `Class.method` or `outer.inner`."""
    original: str
    replacement: str
    tests: tuple[str, ...]
    """pytest node ids or test files, relative to the repository root."""
    why: str
    k: str | None = None
    """A -k expression narrowing `tests`."""


RELAUNCH = "tests/test_relaunch.py"
FAULTS = "tests/test_faults.py"
PIPELINE = "tests/test_pipeline.py"

MUTANTS: tuple[Mutant, ...] = (
    # --- restore / resume ---------------------------------------------------------------------
    Mutant("restore-ignores-commit-marker", "train/checkpoint.py", "Checkpoints.problem",
           "if not (self.directory / str(step) / COMMIT_MARKER).is_file():",
           "if not (self.directory / str(step)).is_dir():",
           (f"{FAULTS}::test_a_corrupt_latest_checkpoint_is_moved_aside_and_the_run_resumes_from_the_one_before"
            "[commit marker deleted]",),
           "a save that never completed (no commit marker) passes as whole: eval and resume read step 6"),
    Mutant("restore-keeps-corrupt-in-place", "train/checkpoint.py", "Checkpoints.restore_newest",
           "self._move_aside(step, str(err))", "pass",
           (f"{FAULTS}::test_a_corrupt_latest_checkpoint_is_moved_aside_and_the_run_resumes_from_the_one_before"
            "[metadata garbled]",),
           "a corrupt newest checkpoint is skipped but not moved to corrupt-<step>/"),
    Mutant("restore-readonly-no-hint", "train/checkpoint.py", "Checkpoints._read",
           "if not self.read_only:", "if self.read_only:",
           (f"{FAULTS}::test_eval_of_a_corrupt_latest_checkpoint_names_the_newest_step_that_restores"
            "[metadata garbled]",),
           "evaluation of a corrupt latest step no longer names the newest step that restores"),
    Mutant("resume-domain-options-free", "train/resume_check.py", "fixed_keys",
           "if f.name not in free)]", "if f.name in free)]",
           (f"{RELAUNCH}::test_keys_that_set_shapes_dtypes_or_the_data_order_are_named[merch-tiny-merch.num_skus-50]",
            f"{RELAUNCH}::test_a_domains_evaluation_only_options_may_change_on_resume"),
           "a relaunch may change the domain's data options (merch.num_skus), not its evaluation-only ones"),
    # --- quantization formats -----------------------------------------------------------------
    Mutant("quant-int8-truncates", "models/quantize.py", "quantize",
           "np.round(scaled).astype(np.int8)", "scaled.astype(np.int8)",
           ("tests/test_quantize.py::test_dequantized_kernels_are_close_to_the_original",), k="int8",
           why="int8 codes truncated toward zero instead of rounded: twice the error, over the 2^-7 bound"),
    Mutant("quant-fp8-decodes-fnuz", "models/quantize.py", "dequantize",
           'values = jax.lax.bitcast_convert_type(stored["codes"], jnp.float8_e4m3fn)',
           'values = jax.lax.bitcast_convert_type(stored["codes"], jnp.float8_e4m3fnuz)',
           ("tests/test_quantize.py::test_dequantized_kernels_are_close_to_the_original",), k="fp8",
           why="fp8 codes read back as e4m3fnuz (exponent bias 8): every weight halved"),
    Mutant("quant-fp4-nibbles-swapped", "models/quantize.py", "quantize",
           "packed = nibbles[..., 0::2, :] | (nibbles[..., 1::2, :] << 4)",
           "packed = nibbles[..., 1::2, :] | (nibbles[..., 0::2, :] << 4)",
           ("tests/test_quantize.py::test_fp4_nibble_packing_is_bit_exact",),
           "fp4 packs the even input index in the high nibble, unpack reads it from the low one"),
    # --- predict writers ----------------------------------------------------------------------
    Mutant("mars-writer-argmin", "eval/domains/mars.py", "MarsIO.write",
           "native_shape).argmax(-1).astype(np.uint8)", "native_shape).argmin(-1).astype(np.uint8)",
           ("tests/test_mars_eval.py::test_predicted_masks_show_their_classes_and_overlays_are_enlarged",),
           "the written mask is each pixel's least likely class"),
    Mutant("deepfake-writer-max-score", "eval/domains/deepfake.py", "DeepfakeIO.write",
           '"fake_probability": float(np.mean(scores)) if scores',
           '"fake_probability": float(np.max(scores)) if scores',
           ("tests/test_deepfake_eval.py::test_predict_writes_per_video_and_per_frame_csv",),
           "a video's score in videos.csv is its highest frame score, not their mean"),
    Mutant("merch-writer-gap-as-wrong-sku", "eval/domains/merch.py", "_status",
           'return "gap"', 'return "wrong_sku"',
           ("tests/test_merch.py::test_planogram_comparison_on_a_hand_made_shelf",),
           "a planned facing found empty is reported as a wrong SKU in the shelf's compliance report"),
    Mutant("merch-writer-classes-as-gallery", "eval/domains/merch.py", "MerchIO.finish",
           '*_five([n for n, _ in r.get("gallery", [])])', '*_five(r["classes"])',
           ("tests/test_merch.py::test_gallery_index_crop_and_shelf_prediction",),
           "with a gallery index, predictions.csv's top1..top5 name the training classes, not the gallery's SKUs"),
    # --- pipeline schedule --------------------------------------------------------------------
    Mutant("schedule-one-iteration-more", "mesh/schedule.py", "schedule_iterations",
           "return repeats * microbatches + stages - 1", "return repeats * microbatches + stages",
           (f"{PIPELINE}::test_bubble_fraction_and_schedule_errors",),
           "the circular schedule counted v*M + P iterations: the bubble fraction and the scan length are off"),
    Mutant("pipeline-rotates-backwards", "mesh/pipeline.py", "rotate_stages",
           "permutation = [(p, (p + 1) % stages) for p in range(stages)]",
           "permutation = [(p, (p - 1) % stages) for p in range(stages)]",
           (f"{PIPELINE}::test_pipelined_encoder_equals_the_plain_scan[4-1-4-pipeline=4,tensor=2]",),
           "the collective-permute sends stage p's output to p - 1 (same as p + 1 on 2 stages: 4 are needed)"),
    Mutant("pipeline-repeat-sign", "mesh/pipeline.py", "circular_pipeline.iteration",
           "repeat = jnp.clip((t - stage_ids) // microbatches, 0, repeats - 1)",
           "repeat = jnp.clip((t + stage_ids) // microbatches, 0, repeats - 1)",
           (f"{PIPELINE}::test_pipelined_encoder_equals_the_plain_scan[2-2-4-pipeline=2,data=2,tensor=2]",),
           "with pipeline.repeats > 1 stage p takes the repeat of microbatch t + p, not t - p: wrong layers"),
    Mutant("pipeline-gather-once-skipped", "mesh/pipeline.py", "gathered_over_fsdp",
           'if mesh.empty or mesh.shape.get("fsdp", 1) == 1:', 'if mesh.empty or mesh.shape.get("fsdp", 1) >= 1:',
           (f"{PIPELINE}::test_pipeline_with_fsdp_gathers_each_stage_once_per_step",),
           "pipeline.gather_once gathers nothing before the loop: XLA gathers every layer in every iteration"),
    # --- domain metrics -----------------------------------------------------------------------
    Mutant("mars-iou-union-double-counts", "train/domains/mars/metrics.py", "confusion_metrics",
           "union = truth + predicted - true_positive", "union = truth + predicted",
           ("tests/test_mars_data.py::test_metrics_on_hand_made_confusion_matrices",),
           "IoU's union counts the true positives twice (mIoU about halved)"),
    Mutant("deepfake-auc-real-positive", "train/domains/deepfake/metrics.py", "roc_metrics",
           "skm.roc_curve(labels, scores, pos_label=1)", "skm.roc_curve(labels, scores, pos_label=0)",
           ("tests/test_deepfake_metrics.py::test_metrics_match_scikit_learn_on_random_scores",),
           "the ROC treats real as the positive class: AUC becomes 1 - AUC"),
    Mutant("deepfake-eer-without-abs", "train/domains/deepfake/metrics.py", "roc_metrics",
           "np.nanargmin(np.abs(fnr - fpr))", "np.nanargmin(fnr - fpr)",
           ("tests/test_deepfake_metrics.py::test_eer_by_hand",),
           "EER read where FNR - FPR is most negative (FPR 1), not where |FNR - FPR| is smallest"),
    Mutant("merch-top1-is-top5", "train/domains/merch/metrics.py", "topk_accuracy",
           "return float(at[0]), float(at[-1])", "return float(at[-1]), float(at[-1])",
           ("tests/test_merch.py::test_retrieval_and_topk_metrics_on_hand_made_embeddings",),
           "top-1 accuracy reported as top-5's (a hit anywhere among the 5 ranks)"),
    # --- issue 38: the metrics and predict writers (breakages 2, 3, 5, 7, 12, 13) ------------------
    Mutant("deepfake-eer-from-fnr", "train/domains/deepfake/metrics.py", "roc_metrics",
           "\"eer\": float(fpr[np.nanargmin(np.abs(fnr - fpr))]),",
           "\"eer\": float(fnr[np.nanargmin(np.abs(fnr - fpr))]),",
           ("tests/test_deepfake_metrics.py::test_metrics_match_scikit_learn_on_random_scores",
            "tests/test_deepfake_metrics.py::test_eer_by_hand_where_the_two_rates_differ_at_the_closest_point",),
           "EER read from the false-negative curve (issue 38 breakage 13)"),
    Mutant("deepfake-family-video-auc-over-all-videos", "train/domains/deepfake/metrics.py", "family_aucs",
           "video_labels, video_mean = video_scores(totals[\"video\"][chosen], labels, scores)",
           "video_labels, video_mean = video_scores(totals[\"video\"], totals[\"label\"], totals[\"score\"])",
           ("tests/test_deepfake_metrics.py::test_family_video_aucs_score_each_familys_videos_against_the_reals",),
           "every family's video AUC computed over all videos (breakage 5)"),
    Mutant("deepfake-holdout-ignored", "train/domains/deepfake/__init__.py", "open_split",
           "chosen = _methods(options.eval_methods) if split == \"test\" else None",
           "chosen = None",
           ("tests/test_deepfake_eval.py::test_holdout_evaluates_one_family",),
           "--holdout ignored: every family scored (breakage 2)"),
    Mutant("mars-tta-flip-not-flipped-back", "eval/domains/mars.py", "MarsIO.probabilities",
           "softmax(frame_logits(mirrored[:, :, ::-1], frame_shape, native_shape, self.stride))",
           "softmax(frame_logits(mirrored, frame_shape, native_shape, self.stride))",
           ("tests/test_predict_outputs.py::test_mars_flip_tta_mirrors_the_windows_and_flips_their_logits_back",
            "tests/test_mars_eval.py::test_flip_tta_averages_the_plain_and_the_mirrored_pass_flipped_back",),
           "--tta flip averages the mirrored pass without flipping its logits back (breakage 3)"),
    Mutant("mars-predict-soil-sand-swapped", "eval/domains/mars.py", "MarsIO.probabilities",
           "            return frame_logits(logits, frame_shape, native_shape, self.stride)\n",
           "            return frame_logits(logits, frame_shape, native_shape, self.stride)[..., [2, 1, 0, 3]]\n",
           ("tests/test_predict_outputs.py::test_a_written_mars_mask_holds_the_class_of_each_pixels_largest_logit_in_its_colour",
            "tests/test_mars_eval.py::test_predicted_masks_show_their_classes_and_overlays_are_enlarged",),
           "mars predictions with soil and sand swapped (breakage 7)"),
    Mutant("mars-square-resize-argmin", "train/domains/mars/evaluator.py", "MarsEvaluator.accumulate",
           "_add_confusion(square, record[\"square_label\"], square_logits.argmax(-1))",
           "_add_confusion(square, record[\"square_label\"], square_logits.argmin(-1))",
           ("tests/test_mars_eval.py::test_eval_cli_writes_report_plot_and_overlays",),
           "the square-resize metric from argmin (breakage 12)"),
    Mutant("deepfake-frame-auc-axes-swapped", "train/domains/deepfake/metrics.py", "roc_metrics",
           "\"auc\": float(skm.auc(fpr, tpr)),",
           "\"auc\": float(skm.auc(tpr, fpr)),",
           ("tests/test_deepfake_metrics.py::test_metrics_match_scikit_learn_on_random_scores",),
           "frame AUC integrated with its axes swapped"),
    Mutant("deepfake-video-auc-of-frames", "train/domains/deepfake/metrics.py", "metrics",
           "\"auc_video\": roc_metrics(video_labels, video_mean)[\"auc\"],",
           "\"auc_video\": frame[\"auc\"],",
           ("tests/test_deepfake_metrics.py::test_video_aggregation_averages_frames_per_video",),
           "video AUC reported as the frame AUC"),
    Mutant("deepfake-ap-of-inverted-scores", "train/domains/deepfake/metrics.py", "roc_metrics",
           "\"ap\": float(skm.average_precision_score(labels, scores)),",
           "\"ap\": float(skm.average_precision_score(labels, 1 - scores)),",
           ("tests/test_deepfake_metrics.py::test_metrics_match_scikit_learn_on_random_scores",),
           "AP of the inverted scores"),
    Mutant("deepfake-eer-mean-of-rates", "train/domains/deepfake/metrics.py", "roc_metrics",
           "\"eer\": float(fpr[np.nanargmin(np.abs(fnr - fpr))]),",
           "\"eer\": float(((fpr + fnr) / 2)[np.nanargmin(np.abs(fnr - fpr))]),",
           ("tests/test_deepfake_metrics.py::test_eer_by_hand_where_the_two_rates_differ_at_the_closest_point",),
           "EER as the mean of the two rates at the closest point"),
    Mutant("mars-miou-of-recall", "train/domains/mars/metrics.py", "confusion_metrics",
           "\"miou\": float(np.nanmean(iou)) if np.isfinite(iou).any() else float(\"nan\"),",
           "\"miou\": float(np.nanmean(recall)) if np.isfinite(iou).any() else float(\"nan\"),",
           ("tests/test_mars_data.py::test_metrics_on_hand_made_confusion_matrices",
            "tests/test_mars_eval.py::test_eval_cli_writes_report_plot_and_overlays",),
           "mIoU reported as mean recall"),
    Mutant("mars-writer-soil-sand-swapped", "eval/domains/mars.py", "MarsIO.write",
           "mask = self.probabilities(outputs[\"logits\"], frame_shape, native_shape).argmax(-1).astype(np.uint8)",
           "mask = np.array([2, 1, 0, 3], np.uint8)[self.probabilities(outputs[\"logits\"], frame_shape, "
           "native_shape).argmax(-1)]",
           ("tests/test_predict_outputs.py::test_a_written_mars_mask_holds_the_class_of_each_pixels_largest_logit_in_its_colour",
            "tests/test_mars_eval.py::test_predicted_masks_show_their_classes_and_overlays_are_enlarged",),
           "the mask writer swaps soil and sand"),
)
