"""A shelf photo's recognised facings against its planogram: boxes grouped into
shelf rows, stacks merged into one facing column, each row aligned to its planned shelf by
Needleman-Wunsch (semi-global where the photo shows part of the bay), the statuses and the score.

Statuses: `ok` (the planned SKU), `misplaced` (a SKU the plan has elsewhere), `foreign` (one the
plan does not have, or none recognised), `missing` (a planned facing with nothing in its place),
`out_of_stock` (a planned facing where the shelf shows a gap at least `OUT_OF_STOCK_WIDTH` of the
expected facing width), `extra` (a facing the plan has no place for). Score = facings in place
(`ok`) / facings planned.

Yucel & Unsalan (2024) align detections to the plan with a modified Needleman-Wunsch the same way;
Tonioni & Di Stefano (2019) judge compliance as detection + recognition + the plan's geometry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

STATUSES = ("ok", "misplaced", "foreign", "missing", "out_of_stock", "extra")
OUT_OF_STOCK_WIDTH = 0.6
"""A space between facings is an empty facing from this share of the expected facing width."""
MATCH, MISMATCH, GAP_FOR_PLANNED, SKIP = 2.0, -1.0, 1.0, -2.5
"""Alignment scores: the planned SKU found; another SKU in its place; a shelf gap where a facing
was planned (its place is kept); a planned facing or a found one left unpaired. Two skips and a
match (-3) cost more than two mismatches (-2), so two swapped neighbours read as misplaced, not as
a missing facing and an extra one."""


GAP_FILL = 0.8
"""A detection scoring from this share of the score threshold is a facing where it stands in a
shelf gap: a facing the detector was less sure of leaves the space an empty facing would. On
merch-shelf-tiny's preset checkpoint at val's thresholds, out-of-stock F1 on val / test: 0.656 /
0.584 without, 0.721 / 0.635 at 0.8, 0.735 / 0.687 at 0.7; but at 0.7 the 1600 x 1200 bay of 293
facings predicted by tiles (scale 0.628) counted 302 (3.1% over; 298 at 0.8, 296 without)."""


PLAN_MARGIN = 0.1
"""A facing may be read as a SKU whose cosine is within this of its nearest SKU's (and at least the
unknown threshold): where that SKU is the one planned there, the facing is in place. A facing's
nearest SKU is most often wrong where a close second is right: on merch-shelf-tiny's val split
(the preset's checkpoint, val's thresholds), foreign F1 0.565 -> 0.575, score MAE 0.0262 -> 0.0254;
at step 1000, margins 0.05 / 0.1 / 0.2 gave foreign F1 0.583 / 0.585 / 0.593 (0 : 0.573)."""


def near_skus(names: np.ndarray, cosines: np.ndarray, floor: float) -> list[frozenset[str]]:
    """Per facing (row), the SKUs among its candidates (`names` (N, C), their `cosines` (N, C))
    within PLAN_MARGIN of its nearest and from `floor` up."""
    cosines = np.asarray(cosines, np.float64).reshape(len(names), -1)
    near = cosines >= np.maximum(cosines.max(axis=1, initial=-np.inf) - PLAN_MARGIN, floor)[:, None]
    names = np.asarray(names, object).reshape(cosines.shape)
    return [frozenset(row[keep]) for row, keep in zip(names, near, strict=True)]


@dataclasses.dataclass(frozen=True)
class Column:
    """One facing column of a row: its x extent, its SKU (None: unrecognised; "" a shelf gap)."""
    x1: float
    x2: float
    sku: str | None
    boxes: tuple[int, ...] = ()
    accepts: frozenset[str] = frozenset()
    """SKUs the facing may also be read as: nearly as near as its own."""


def group_rows(boxes: np.ndarray) -> list[list[int]]:
    """Box indices by shelf row, top to bottom, each row left to right: centres sorted by height,
    a new row where the next centre is more than half the median box height below the last."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    if len(boxes) == 0:
        return []
    cy = (boxes[:, 1] + boxes[:, 3]) / 2
    step = 0.5 * np.median(boxes[:, 3] - boxes[:, 1])
    order = np.argsort(cy, kind="stable")
    rows, current = [], [int(order[0])]
    for a, b in zip(order[:-1], order[1:], strict=True):
        if cy[b] - cy[a] > step:
            rows.append(current)
            current = []
        current.append(int(b))
    rows.append(current)
    return [sorted(row, key=lambda i: boxes[i, 0]) for row in rows]


def columns_of(row: Sequence[int], boxes: np.ndarray, skus: Sequence[str | None],
               accepts: Sequence[frozenset[str]] | None = None) -> list[Column]:
    """A row's boxes as facing columns (a stack, boxes overlapping in x by over half the narrower,
    is one column with the SKU of its lowest recognised box: an unrecognised box over a recognised
    one is most often the same facing found twice, loosely), then the shelf gaps between columns
    as columns of SKU "" (a space of at least OUT_OF_STOCK_WIDTH x the expected facing width: the
    narrower of its two neighbours, since a gap most often opens inside a run of one SKU).
    `accepts`: per box, the other SKUs it may be read as (its column takes its lowest box's)."""
    accepts = accepts or [frozenset()] * len(skus)
    columns: list[Column] = []
    for i in row:
        x1, x2 = float(boxes[i, 0]), float(boxes[i, 2])
        if columns:
            last = columns[-1]
            overlap = min(last.x2, x2) - max(last.x1, x1)
            if overlap > 0.5 * min(last.x2 - last.x1, x2 - x1):
                stack = (*last.boxes, i)
                lowest = max(stack, key=lambda j: (skus[j] is not None, boxes[j, 3]))
                columns[-1] = Column(min(last.x1, x1), max(last.x2, x2), skus[lowest],
                                     (lowest, *[j for j in stack if j != lowest]), accepts[lowest])
                continue
        columns.append(Column(x1, x2, skus[i], (i,), accepts[i]))
    if not columns:
        return []
    out = [columns[0]]
    for column in columns[1:]:
        start = out[-1].x2
        space = column.x1 - start
        width = min(out[-1].x2 - out[-1].x1, column.x2 - column.x1)
        gaps = max(0, int(space / width + 1 - OUT_OF_STOCK_WIDTH))  # 0.6 w -> 1, 1.6 w -> 2, ...
        out += [Column(start + k * space / gaps, start + (k + 1) * space / gaps, "") for k in range(gaps)]
        out.append(column)
    return out


def cut_sides(columns: Sequence[Column], width: float) -> tuple[bool, bool]:
    """Whether the photo's edges cut a row of columns (left, right): no room for a facing between an
    edge and its nearest column (less than OUT_OF_STOCK_WIDTH of that column's width), so the bay
    may go on out of view, where a facing planned is not missing."""
    if not columns:
        return False, False
    first, last = columns[0], columns[-1]
    return (first.x1 < OUT_OF_STOCK_WIDTH * (first.x2 - first.x1),
            width - last.x2 < OUT_OF_STOCK_WIDTH * (last.x2 - last.x1))


def shelf_facings(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> np.ndarray:
    """Indices of a photo's facings among its detections: those scoring `threshold` or more, and
    in each shelf gap they leave (`columns_of`) the best detection from GAP_FILL x `threshold` up
    whose centre lies in the gap, within its row's height; in ascending index order."""
    boxes, scores = np.asarray(boxes, np.float64).reshape(-1, 4), np.asarray(scores, np.float64)
    kept = np.flatnonzero(scores >= threshold)
    below = np.flatnonzero((scores >= GAP_FILL * threshold) & (scores < threshold))
    if len(kept) == 0 or len(below) == 0:
        return kept
    below = below[np.argsort(-scores[below], kind="stable")]
    centres = (boxes[below, :2] + boxes[below, 2:]) / 2
    taken = np.zeros(len(below), bool)
    for row in group_rows(boxes[kept]):
        top, bottom = boxes[kept[row], 1].min(), boxes[kept[row], 3].max()
        for gap in (c for c in columns_of(row, boxes[kept], [None] * len(kept)) if c.sku == ""):
            inside = ((centres[:, 0] >= gap.x1) & (centres[:, 0] <= gap.x2) & (centres[:, 1] >= top)
                      & (centres[:, 1] <= bottom) & ~taken)
            if inside.any():
                taken[np.argmax(inside)] = True  # the best first: below is sorted by score
    return np.sort(np.concatenate([kept, below[taken]]))


Partial = bool | tuple[bool, bool]
"""Whether the photo shows part of the bay: on both sides, or (left, right) each on its own."""


def _sides(partial: Partial) -> tuple[bool, bool]:
    return (partial, partial) if isinstance(partial, bool) else (bool(partial[0]), bool(partial[1]))


def align(found: Sequence[str | None], planned: Sequence[str | None], partial: Partial = False,
          accepts: Sequence[frozenset[str]] | None = None) -> list[tuple[int | None, int | None]]:
    """Needleman-Wunsch of a row's found SKUs ("" a gap, None unrecognised) against its plan (None
    planned empty): pairs (found index, planned index), None for an unpaired side, left to right.
    `partial`: the photo shows part of the bay, so planned facings before the first (left) and
    after the last (right) found one cost nothing (semi-global). A pair scores MATCH for the planned SKU (the found
    one, or one of the found facing's `accepts`), GAP_FOR_PLANNED for a gap, MISMATCH otherwise."""
    accepts = accepts or [frozenset()] * len(found)
    score = lambda i, j: _pair_score(found[i], accepts[i], planned[j])
    n, m = len(found), len(planned)
    table = np.zeros((n + 1, m + 1))
    table[1:, 0] = SKIP * np.arange(1, n + 1)
    left, right = _sides(partial)
    table[0, 1:] = 0.0 if left else SKIP * np.arange(1, m + 1)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            table[i, j] = max(table[i - 1, j - 1] + score(i - 1, j - 1), table[i - 1, j] + SKIP,
                              table[i, j - 1] + SKIP)
    j = int(np.argmax(table[n])) if right else m  # trailing planned facings free when open on the right
    pairs: list[tuple[int | None, int | None]] = [(None, k) for k in range(m - 1, j - 1, -1)]
    i = n
    while i > 0 or j > 0:
        if i > 0 and j > 0 and np.isclose(table[i, j], table[i - 1, j - 1] + score(i - 1, j - 1)):
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif i > 0 and (j == 0 or np.isclose(table[i, j], table[i - 1, j] + SKIP)):
            pairs.append((i - 1, None))
            i -= 1
        else:
            pairs.append((None, j - 1))
            j -= 1
    return pairs[::-1]


def reads_as(found: str | None, accepts: frozenset[str], planned: str | None) -> bool:
    """Whether a found facing is the planned SKU: its own, or one it may also be read as."""
    return planned is not None and found != "" and (found == planned or planned in accepts)


def _pair_score(found: str | None, accepts: frozenset[str], planned: str | None) -> float:
    if planned is None:
        return MATCH if found == "" else MISMATCH
    if found == "":
        return GAP_FOR_PLANNED
    return MATCH if reads_as(found, accepts, planned) else MISMATCH


def row_statuses(found: Sequence[str | None], planned: Sequence[str | None], plan_skus: set[str],
                 partial: Partial = False, accepts: Sequence[frozenset[str]] | None = None
                 ) -> tuple[list[str | None], list[str | None]]:
    """(a status per found column, a status per planned facing) of one aligned row. None: a shelf
    gap where nothing was planned, a planned empty, and (`partial`) a planned facing outside the
    part of the bay the photo shows (before the first or after the last facing paired)."""
    on_found: list[str | None] = [None] * len(found)
    on_plan: list[str | None] = [None] * len(planned)
    accepts = accepts or [frozenset()] * len(found)
    pairs = align(found, planned, partial, accepts)
    paired = [j for i, j in pairs if i is not None and j is not None]
    left, right = _sides(partial)
    shown = range(min(paired) if left and paired else 0, max(paired) + 1 if right and paired else len(planned))
    unplanned = lambda sku: None if sku == "" else ("extra" if sku in plan_skus else "foreign")
    for i, j in pairs:
        if i is None:
            on_plan[j] = "missing" if planned[j] is not None and j in shown else None
        elif j is None or planned[j] is None:
            on_found[i] = unplanned(found[i])
        else:
            sku = found[i]
            status = ("out_of_stock" if sku == "" else "ok" if reads_as(sku, accepts[i], planned[j])
                      else "misplaced" if sku in plan_skus else "foreign")
            on_found[i] = on_plan[j] = status
    return on_found, on_plan


def compliance(found_rows: Sequence[Sequence[str | None]], shelves: Sequence[Sequence[str | None]],
               partial: bool = False, accepts: Sequence[Sequence[frozenset[str]]] | None = None,
               open_sides: Sequence[tuple[bool, bool]] | None = None) -> dict:
    """The whole photo: rows (top to bottom, found SKUs left to right) against the planned shelves,
    row r to shelf r (rows past the plan: every facing unplanned). Counts per status (a paired
    status counted once), the planned facings in view, the score, and each row's statuses.
    `accepts`: per row, per found facing, the SKUs it may also be read as; `open_sides`: per row,
    whether the photo cuts it (left, right), in place of `partial`."""
    plan_skus = {s for shelf in shelves for s in shelf if s is not None}
    counts = dict.fromkeys(STATUSES, 0)
    rows, planned_facings = [], 0
    for r in range(max(len(shelves), len(found_rows))):
        found = found_rows[r] if r < len(found_rows) else []
        also = accepts[r] if accepts is not None and r < len(accepts) else None
        sides = open_sides[r] if open_sides is not None and r < len(open_sides) else partial
        on_found, on_plan = row_statuses(found, shelves[r] if r < len(shelves) else [], plan_skus, sides, also)
        for status in on_found + [s for s in on_plan if s == "missing"]:
            if status is not None:
                counts[status] += 1
        planned_facings += sum(s is not None for s in on_plan)
        rows.append({"found": on_found, "planned": on_plan})
    return {"counts": counts, "planned": planned_facings, "score": counts["ok"] / max(planned_facings, 1),
            "rows": rows}


def shelf_report(boxes: np.ndarray, scores: np.ndarray, skus: list[str | None], cosines: list[float | None],
                 shelves: list[list[str | None]] | None, accepts: Sequence[frozenset[str]] | None = None,
                 width: float | None = None) -> dict[str, Any]:
    """The photo's report: every facing (box, SKU, confidence, similarity, row, status), and with a
    plan (`shelves`, None for planned empty) each shelf gap (box: its space between the columns, the
    row's height; row; status: `out_of_stock` where a facing was planned, None where none was), each
    row's alignment, the status counts and the score. `width`: the photo's, whose edges may cut a
    row (`cut_sides`): planned facings past a cut are out of view, not missing."""
    rows = group_rows(boxes)
    facings = [{"box": [round(float(v), 1) for v in boxes[i]], "sku": skus[i], "confidence": round(float(scores[i]), 4),
                "similarity": None if cosines[i] is None else round(cosines[i], 4), "row": r, "status": None}
               for r, row in enumerate(rows) for i in row]
    by_box = {i: f for f, i in zip(facings, [i for row in rows for i in row], strict=True)}
    report: dict[str, Any] = {"found": len(facings), "facings": facings}
    if shelves is None:
        return report
    columns = [columns_of(row, boxes, skus, accepts) for row in rows]
    judged = compliance([[c.sku for c in row] for row in columns], shelves,
                        accepts=[[c.accepts for c in row] for row in columns],
                        open_sides=None if width is None else [cut_sides(row, width) for row in columns])
    gaps = []
    for r, (row, statuses) in enumerate(zip(columns, judged["rows"], strict=False)):
        top, bottom = float(boxes[rows[r], 1].min()), float(boxes[rows[r], 3].max())
        for column, status in zip(row, statuses["found"], strict=True):
            for i in column.boxes:
                by_box[i]["status"] = status
            if column.sku == "":
                gaps.append({"box": [round(v, 1) for v in (column.x1, top, column.x2, bottom)], "row": r,
                             "status": status})
    return {**report, "gaps": gaps, "planned": judged["planned"], "counts": judged["counts"],
            "score": judged["score"], "rows": judged["rows"]}
