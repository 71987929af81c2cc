"""NegBench MCQ (Alhamoud et al. 2025): an image and 4 captions, exactly one of them correct.

The released CSVs (m1k2zoo/negbench, e.g. `images/COCO_val_mcq_llama3.1_rephrased.csv`,
`images/VOC2007_mcq_llama3.1_rephrased.csv`) have columns `image_path`, `correct_answer`
(index 0..3), `caption_0`..`caption_3` and `correct_answer_template`: the template of the
correct caption, `positive` ("features A and B"), `negative` ("does not feature N") or
`hybrid` ("features A, but not N"), stored here as affirmative / negation / hybrid.

`image_path` holds the authors' own paths (the release asks users to rewrite them), so
by default only its file name is used, looked up in `images` (COCO val2017 or VOC2007
JPEGImages); `image_path_mode="relative"` instead joins the whole path under `images`.

One group per CSV row (an image can have several rows); 4 items per group, with
`caption_index`, `correct` and the group's `template`; no human score.
"""

from __future__ import annotations

import posixpath

from pipeline.benchmarks.common import LoadResult, Problem
from pipeline.benchmarks.io import BadOption, ProblemLog, items_table, parse_int, read_csv, require_image, text_value
from pipeline.store.folder import BadRecord, Folder

LOADER = "negbench"  # the name benchmark configs give as `loader:`

N_OPTIONS = 4
TEMPLATES = {
    "positive": "affirmative",
    "negative": "negation",
    "hybrid": "hybrid",
    "affirmative": "affirmative",
    "negation": "negation",
}
PATH_MODES = ("basename", "relative")
COLUMNS = ["image_path", "correct_answer", *(f"caption_{k}" for k in range(N_OPTIONS)), "correct_answer_template"]


def load(
    root: str,
    *,
    benchmark: str = "negbench",
    csv: str = "images/COCO_val_mcq_llama3.1_rephrased.csv",
    images: str = "val2017",
    image_path_mode: str = "basename",
) -> LoadResult:
    """Load one NegBench MCQ CSV from `root`; bad rows are reported and skipped."""
    if image_path_mode not in PATH_MODES:
        raise BadOption(f"negbench: image_path_mode must be one of {PATH_MODES}, got {image_path_mode!r}")
    folder = Folder(root)
    image_folder = folder.sub(images)
    csv_folder, path = folder.locate(csv)
    _, records = read_csv(csv_folder, path, COLUMNS)
    problems: list[Problem] = []
    log = ProblemLog(csv_folder.uri(path), problems)

    rows = []
    for row_index, (record, row) in enumerate(records):
        try:
            captions = [text_value(row[f"caption_{k}"], f"caption_{k}") for k in range(N_OPTIONS)]
            correct = parse_int(row["correct_answer"], "correct_answer")
            if not 0 <= correct < N_OPTIONS:
                raise BadRecord("correct_answer", f"{correct} is not an option index 0..{N_OPTIONS - 1}")
            template = TEMPLATES.get((row["correct_answer_template"] or "").strip().lower())
            if template is None:
                raise BadRecord(
                    "correct_answer_template",
                    f"unknown template {row['correct_answer_template']!r}; expected one of {sorted(TEMPLATES)}",
                )
            image_path = text_value(row["image_path"], "image_path")
            if image_path_mode == "basename":
                image_path = posixpath.basename(image_path.replace("\\", "/"))
            image_uri = require_image(image_folder, image_path, "image_path")
        except BadRecord as exc:
            log.bad(record, exc)
            continue
        group = str(row_index)
        rows += [
            {
                "item_id": f"{benchmark}/{group}/{k}",
                "image_uri": image_uri,
                "caption": captions[k],
                "group_id": group,
                "caption_index": k,
                "correct": k == correct,
                "template": template,
            }
            for k in range(N_OPTIONS)
        ]
    return LoadResult(items=items_table(rows, benchmark), problems=problems)
