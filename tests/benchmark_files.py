"""Write small copies of the five benchmarks in their exact official file formats.

Used by the loader tests and by end-to-end tests that run the whole sweep on fixture
copies. Each writer takes a `root` folder, sizes, and `bad`: names of faults to inject,
each one a malformed record of the kind real releases contain. It returns `Written`:
what a correct loader should produce from those files (counts of items, groups and
problems) and the loader options needed to read them.

Images are tiny PIL images, each a different colour so their content hashes differ.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from PIL import Image

from pipeline.benchmarks.tfrecord import build_example, write_records


@dataclass(frozen=True)
class Written:
    root: Path
    items: int  # items a correct loader returns
    groups: int  # distinct group_id values among them
    problems: int  # problems it reports
    options: dict = field(default_factory=dict)  # loader options (beyond defaults) to read these files


def image_bytes(index: int, fmt: str = "PNG") -> bytes:
    """A 4x4 image whose colour is determined by `index`."""
    color = (index * 37 % 256, index * 91 % 256, index * 53 % 256)
    out = io.BytesIO()
    Image.new("RGB", (4, 4), color).save(out, format=fmt)
    return out.getvalue()


def _save_image(path: Path, index: int, fmt: str = "PNG") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(image_bytes(index, fmt))


def _json_object(pairs: Sequence[tuple[str, object]]) -> str:
    """JSON object text from key/value pairs; unlike json.dumps it can repeat a key."""
    body = ",\n".join(f"  {json.dumps(key)}: {json.dumps(value, indent=2)}" for key, value in pairs)
    return "{\n" + body + "\n}\n"


def _check_bad(bad: Collection[str], allowed: Collection[str]) -> None:
    unknown = set(bad) - set(allowed)
    if unknown:
        raise ValueError(f"unknown fault(s) {sorted(unknown)}; choose from {sorted(allowed)}")


# --- GenAI-Bench ---------------------------------------------------------------------------

GENAI_FAULTS = ("rating_out_of_range", "non_numeric", "missing_image", "duplicate_id", "escaping_path")


def genai_ratings(prompt: int, model: int) -> list[int]:
    """The three 1-5 ratings `write_genai_bench` gives image (prompt, model)."""
    return [1 + (prompt + model + rater) % 5 for rater in range(3)]


def genai_prompt_id(prompt: int, release: str = "1600") -> str:
    return f"{prompt + (release == '527'):05d}"  # 1600 counts from 00000, 527 from 00001


def genai_skills(n_prompts: int, release: str = "1600") -> dict[str, list[int]]:
    ids = [int(genai_prompt_id(p, release)) for p in range(n_prompts)]
    return {
        "basic": ids[0::2],
        "attribute": ids[0::2],
        "advanced": ids[1::2],
        "counting": ids[1:2],
    }


def write_genai_bench(
    root: str | Path,
    *,
    release: str = "1600",
    n_prompts: int = 4,
    models: Sequence[str] = ("DALLE_3", "SDXL_Base"),
    bad: Collection[str] = (),
) -> Written:
    """`genai_image.json`, `genai_skills.json` and `<model>/<prompt id>.jpeg` images."""
    _check_bad(bad, GENAI_FAULTS)
    if bad and n_prompts < 3:
        raise ValueError("faults need at least 3 prompts")
    root = Path(root)
    entries = []
    for p in range(n_prompts):
        prompt_id = genai_prompt_id(p, release)
        ratings = {m: genai_ratings(p, k) for k, m in enumerate(models)}
        entries.append(
            (
                prompt_id,
                {"id": prompt_id, "prompt": f"prompt number {p}", "prompt in Chinese": "提示", "models": ratings},
            )
        )
        for k, model in enumerate(models):
            _save_image(root / model / f"{prompt_id}.jpeg", p * 10 + k, "JPEG")
    kept = {(p, k) for p in range(n_prompts) for k in range(len(models))}  # images a loader keeps
    problems = 0
    if "rating_out_of_range" in bad:
        entries[0][1]["models"][models[0]] = [6, 4, 5]
        kept.discard((0, 0))
        problems += 1
    if "non_numeric" in bad:
        entries[1][1]["models"][models[0]] = ["5", 4, 4]
        kept.discard((1, 0))
        problems += 1
    if "missing_image" in bad:
        (root / models[-1] / f"{entries[-1][0]}.jpeg").unlink()
        kept.discard((n_prompts - 1, len(models) - 1))
        problems += 1
    if "duplicate_id" in bad:
        entries.append((entries[2][0], {"prompt": "a second copy", "models": {models[0]: [1, 1, 1]}}))
        problems += 1
    if "escaping_path" in bad:
        # the image would be <model>/../../outside.jpeg: it exists, and must still be refused
        entries.append(("../../outside", {"prompt": "escaping", "models": {models[0]: [3, 3, 3]}}))
        _save_image(root.parent / "outside.jpeg", 999, "JPEG")
        problems += 1
    (root / "genai_image.json").write_text(_json_object(entries), encoding="utf-8")
    (root / "genai_skills.json").write_text(json.dumps(genai_skills(n_prompts, release), indent=2))
    items, groups = len(kept), len({p for p, _ in kept})
    return Written(root, items, groups, problems, {"release": release})


def write_genai_bench_parquet(
    root: str | Path,
    *,
    n_prompts: int = 3,
    models: Sequence[str] = ("DALLE_3", "SDXL_Base"),
    bad: Collection[str] = (),
) -> Written:
    """The Hugging Face export: `data/train-00000-of-00001.parquet` with embedded images."""
    _check_bad(bad, ("rating_out_of_range", "missing_image", "duplicate_id"))
    root = Path(root)
    rows = []
    for p in range(n_prompts):
        rows.append(
            {
                "Index": p,
                "Prompt": f"prompt number {p}",
                "Tags": {
                    "basic": ["Attribute", "Scene"] if p % 2 == 0 else [],
                    "advanced": ["Counting"] if p % 2 else [],
                },
                "HumanRatings": {m: genai_ratings(p, k) for k, m in enumerate(models)},
                **{
                    m: {"bytes": image_bytes(p * 10 + k, "JPEG"), "path": f"{p:05d}.jpeg"} for k, m in enumerate(models)
                },
            }
        )
    items, problems = n_prompts * len(models), 0
    if "rating_out_of_range" in bad:
        rows[0]["HumanRatings"][models[0]] = [0, 3, 3]
        items, problems = items - 1, problems + 1
    if "missing_image" in bad:
        rows[-1][models[-1]] = {"bytes": None, "path": None}
        items, problems = items - 1, problems + 1
    if "duplicate_id" in bad:
        rows.append({**rows[1], "Prompt": "a second copy"})
        problems += 1
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema(
        [
            ("Index", pa.int64()),
            ("Prompt", pa.string()),
            ("Tags", pa.struct([("advanced", pa.list_(pa.string())), ("basic", pa.list_(pa.string()))])),
            ("HumanRatings", pa.struct([(m, pa.list_(pa.int64())) for m in models])),
            *((m, image) for m in models),
        ]
    )
    (root / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=schema), root / "data" / "train-00000-of-00001.parquet", row_group_size=2
    )
    return Written(root, items, n_prompts, problems, {"format": "parquet"})


# --- TIFA160 ---------------------------------------------------------------------------------

TIFA_GENERATORS = {  # TIFA's key suffix -> DSG's name
    "mini_dalle": "mini-dalle",
    "vq_diffusion": "vq-diffusion",
    "stable_diffusion_v1_1": "sd1dot1",
    "stable_diffusion_v1_5": "sd1dot5",
    "stable_diffusion_v2_1": "sd2dot1",
}
TIFA_FAULTS = (
    "rating_out_of_range",
    "missing_image",
    "duplicate_id",
    "escaping_path",
    "human_avg_mismatch",
    "likert_out_of_range",
    "likert_non_numeric",
)


def tifa_scores(image: int) -> list[int]:
    """TIFA's two ratings of image number `image`."""
    return [1 + image % 5, 1 + (image * 3) % 5]


def likert_scores(image: int) -> list[int]:
    """DSG's five Likert ratings of image number `image`."""
    return [1 + (image + worker) % 5 for worker in range(5)]


def write_tifa160(root: str | Path, *, n_prompts: int = 3, bad: Collection[str] = ()) -> Written:
    """`human_annotations.json`, `annotated_images/` and DSG's `tifa160-likert-anns.csv`.

    `Written` counts are for the default human signal (TIFA's ratings); the Likert
    faults only matter with human="likert".
    """
    _check_bad(bad, TIFA_FAULTS)
    root = Path(root)
    entries, likert_rows = [], []
    for p in range(n_prompts):
        text_id = f"coco_{1000 + p}"
        for g, (suffix, dsg_name) in enumerate(TIFA_GENERATORS.items()):
            image = p * len(TIFA_GENERATORS) + g
            key = f"{text_id}_{suffix}"
            scores = tifa_scores(image)
            entries.append(
                (
                    key,
                    {
                        "text_id": text_id,
                        "image_path": f"{key}.jpg",
                        "text": f"caption of prompt {p}",
                        "human_scores": scores,
                        "human_avg": sum(scores) / len(scores),
                    },
                )
            )
            _save_image(root / "annotated_images" / f"{key}.jpg", image, "JPEG")
            for worker, answer in enumerate(likert_scores(image)):
                likert_rows.append(
                    {
                        "item_id": f"tifa160_{p}",
                        "t2i_model": dsg_name,
                        "source_id": text_id,
                        "worker_id": str(4000 + worker),
                        "answer": str(answer),
                    }
                )
    items, problems = len(entries), 0
    if "rating_out_of_range" in bad:
        entries[0][1]["human_scores"] = [0, 3]
        entries[0][1]["human_avg"] = 1.5
        items, problems = items - 1, problems + 1
    if "human_avg_mismatch" in bad:
        entries[3][1]["human_avg"] = 4.5 if entries[3][1]["human_avg"] != 4.5 else 1.0
        items, problems = items - 1, problems + 1
    if "missing_image" in bad:
        (root / "annotated_images" / entries[-1][1]["image_path"]).unlink()
        items, problems = items - 1, problems + 1
    if "escaping_path" in bad:
        entries[2][1]["image_path"] = "../outside.jpg"
        _save_image(root / "outside.jpg", 999, "JPEG")  # exists, and must still be refused
        items, problems = items - 1, problems + 1
    if "duplicate_id" in bad:
        entries.append((entries[1][0], {**entries[1][1], "text": "a second copy"}))
        problems += 1
    if "likert_out_of_range" in bad:
        likert_rows[5]["answer"] = "9"
    if "likert_non_numeric" in bad:
        likert_rows[6]["answer"] = "five"
    (root / "human_annotations.json").write_text(_json_object(entries), encoding="utf-8")
    with open(root / "tifa160-likert-anns.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["item_id", "t2i_model", "source_id", "worker_id", "answer"])
        writer.writeheader()
        writer.writerows(likert_rows)
    return Written(root, items, n_prompts, problems)


# --- RichHF-18K --------------------------------------------------------------------------------

RICHHF_FAULTS = ("truncated", "corrupt_crc", "missing_image", "missing_caption", "duplicate_id", "non_finite")


def richhf_uid(index: int) -> str:
    return f"{index:08x}-1b2c-4d3e-8f40-{index:012x}"


def richhf_score(index: int) -> float:
    """The misalignment score of image `index` (exactly representable as float32)."""
    return (index % 8) / 8


def write_richhf(
    root: str | Path,
    *,
    n_images: int = 6,
    n_captions: int = 3,
    captions_format: str = "parquet",
    pickapic_columns: bool = False,
    bad: Collection[str] = (),
) -> Written:
    """`test.tfrecord` (RichHF's 8 features), a Pick-a-Pic captions table and `images/<uid>.jpg`.

    Faults act on fixed records: corrupt_crc on record 2 (reading stops there),
    missing_image 1, missing_caption 3, non_finite 4, a duplicate of record 0 inserted
    before the last record, truncated cuts the last record.
    """
    _check_bad(bad, RICHHF_FAULTS)
    if bad and n_images < 6:
        raise ValueError("faults need at least 6 images")
    root = Path(root)
    heatmap = image_bytes(0, "PNG")
    records, uids, captions = [], [], {}
    for i in range(n_images):
        uid = richhf_uid(i)
        uids.append(uid)
        captions[uid] = f"pick-a-pic prompt {i % n_captions}"
        score = math.nan if ("non_finite" in bad and i == 4) else richhf_score(i)
        records.append(
            build_example(
                {
                    "filename": f"{uid}.png",
                    "aesthetics_score": 0.5,
                    "artifact_score": 0.25,
                    "misalignment_score": score,
                    "overall_score": 0.75,
                    "artifact_map": heatmap,
                    "misalignment_map": heatmap,
                    "prompt_misalignment_label": " ".join("1" for _ in captions[uid].split()),
                }
            )
        )
        _save_image(root / "images" / f"{uid}.jpg", i, "JPEG")
    if "missing_caption" in bad:
        del captions[uids[3]]
    if "missing_image" in bad:
        (root / "images" / f"{uids[1]}.jpg").unlink()
    order = list(range(n_images))  # image index of each record in the file
    if "duplicate_id" in bad:
        records.insert(n_images - 1, records[0])
        order.insert(n_images - 1, 0)
    stream = io.BytesIO()
    write_records(stream, records)
    data = bytearray(stream.getvalue())
    readable = len(records)  # records before the first damaged one
    if "corrupt_crc" in bad:
        data[sum(12 + len(r) + 4 for r in records[:2]) + 12 + 5] ^= 0xFF  # inside record 2's payload
        readable = 2
    elif "truncated" in bad:
        readable = len(records) - 1
    if "truncated" in bad:
        data = data[: len(data) - len(records[-1]) // 2]
    # position in the file of each record-level fault
    at = {"missing_image": 1, "missing_caption": 3, "non_finite": 4, "duplicate_id": n_images - 1}
    problems = sum(1 for f in bad if f in at and at[f] < readable) + bool({"corrupt_crc", "truncated"} & set(bad))
    dropped = {at[f] for f in bad if f in at}
    kept = {order[pos] for pos in range(readable) if pos not in dropped}
    (root / "test.tfrecord").write_bytes(bytes(data))
    _write_captions(root, captions, captions_format, pickapic_columns)
    groups = len({captions[uids[i]] for i in kept})
    options = {} if captions_format == "parquet" else {"captions": "pickapic_captions.csv"}
    return Written(root, len(kept), groups, problems, options)


def _write_captions(root: Path, captions: dict[str, str], fmt: str, pickapic_columns: bool) -> None:
    if pickapic_columns:
        # Pick-a-Pic's own layout: one row per comparison of two images of one prompt; each
        # image here meets an unrated partner, and the first one appears in a second row.
        uids = list(captions)
        rows = [(captions[u], u, f"unrated-{k}") for k, u in enumerate(uids)]
        rows.append((captions[uids[0]], f"unrated-{len(uids)}", uids[0]))
        table = pa.table(
            {
                "caption": [r[0] for r in rows],
                "image_0_uid": [r[1] for r in rows],
                "image_1_uid": [r[2] for r in rows],
                "jpg_0": [image_bytes(0, "JPEG") for _ in rows],
            }
        )
    else:
        table = pa.table({"uid": list(captions), "caption": list(captions.values())})
    if fmt == "parquet":
        pq.write_table(table, root / "pickapic_captions.parquet")
    elif fmt == "csv":
        pacsv.write_csv(table.drop_columns(["jpg_0"]) if pickapic_columns else table, root / "pickapic_captions.csv")
    else:
        raise ValueError(f"captions_format must be parquet or csv, got {fmt!r}")


# --- Winoground ----------------------------------------------------------------------------------

WINOGROUND_FAULTS = ("missing_image", "duplicate_id", "escaping_path", "bad_json", "empty_caption")


def winoground_example(i: int) -> dict:
    return {
        "id": i,
        "caption_0": f"a red thing left of a blue thing {i}",
        "caption_1": f"a blue thing left of a red thing {i}",
        "tag": "Object",
        "image_0": f"ex_{i}_img_0",
        "image_1": f"ex_{i}_img_1",
        "secondary_tag": "Symbolic" if i % 2 else "",
        "num_main_preds": 1,
        "collapsed_tag": "Object" if i % 2 else "Relation",
    }


def write_winoground(root: str | Path, *, n_examples: int = 4, bad: Collection[str] = ()) -> Written:
    """`data/examples.jsonl` and `data/images/ex_<i>_img_<j>.png`."""
    _check_bad(bad, WINOGROUND_FAULTS)
    if bad and n_examples < 4:
        raise ValueError("faults need at least 4 examples")
    root = Path(root)
    examples = [winoground_example(i) for i in range(n_examples)]
    for ex in examples:
        for j in (0, 1):
            _save_image(root / "data" / "images" / f"{ex[f'image_{j}']}.png", ex["id"] * 2 + j)
    kept, problems = set(range(n_examples)), 0
    lines = [json.dumps(ex) for ex in examples]
    if "missing_image" in bad:
        (root / "data" / "images" / "ex_1_img_1.png").unlink()
        kept.discard(1)
        problems += 1
    if "escaping_path" in bad:
        examples[2]["image_0"] = "../../outside"
        lines[2] = json.dumps(examples[2])
        _save_image(root / "outside.png", 999)  # exists, and must still be refused
        kept.discard(2)
        problems += 1
    if "empty_caption" in bad:
        examples[3]["caption_1"] = ""
        lines[3] = json.dumps(examples[3])
        kept.discard(3)
        problems += 1
    if "duplicate_id" in bad:
        lines.append(json.dumps({**examples[0], "caption_0": "a second copy"}))
        problems += 1
    if "bad_json" in bad:
        lines.insert(1, '{"id": 17, "caption_0": "cut off')
        problems += 1
    (root / "data" / "examples.jsonl").write_text("\n".join(lines) + "\n")
    return Written(root, 4 * len(kept), len(kept), problems)


def write_winoground_parquet(root: str | Path, *, n_examples: int = 4, bad: Collection[str] = ()) -> Written:
    """The Hugging Face Parquet export: `default/test/0000.parquet`, images embedded."""
    _check_bad(bad, ("missing_image", "duplicate_id"))
    root = Path(root)
    rows = []
    for i in range(n_examples):
        ex = winoground_example(i)
        for j in (0, 1):
            ex[f"image_{j}"] = {"bytes": image_bytes(i * 2 + j), "path": f"ex_{i}_img_{j}.png"}
        rows.append(ex)
    kept, problems = n_examples, 0
    if "missing_image" in bad:
        rows[1]["image_1"] = {"bytes": None, "path": "ex_1_img_1.png"}
        kept, problems = kept - 1, problems + 1
    if "duplicate_id" in bad:
        rows.append({**rows[0], "caption_0": "a second copy"})
        problems += 1
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema(
        [
            ("id", pa.int32()),
            ("image_0", image),
            ("image_1", image),
            ("caption_0", pa.string()),
            ("caption_1", pa.string()),
            ("tag", pa.string()),
            ("secondary_tag", pa.string()),
            ("num_main_preds", pa.int32()),
            ("collapsed_tag", pa.string()),
        ]
    )
    (root / "default" / "test").mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=schema), root / "default" / "test" / "0000.parquet", row_group_size=2
    )
    return Written(root, 4 * kept, kept, problems, {"format": "parquet"})


# --- NegBench --------------------------------------------------------------------------------------

NEGBENCH_FAULTS = ("unknown_template", "answer_out_of_range", "non_numeric_answer", "missing_image", "escaping_path")
NEGBENCH_TEMPLATES = ("positive", "negative", "hybrid")
AUTHORS_PREFIX = "/data/healthy-ml/scratch/coco/images/val2017/"


def negbench_image_name(row: int) -> str:
    return f"{100000 + row // 2:012d}.jpg"  # two questions per image, as in the release


def write_negbench(
    root: str | Path, *, n_rows: int = 6, relative_paths: bool = False, bad: Collection[str] = ()
) -> Written:
    """`images/COCO_val_mcq_llama3.1_rephrased.csv` and COCO-style `val2017/<id>.jpg` images.

    `image_path` holds the authors' absolute paths as released, or (relative_paths=True)
    paths relative to the image folder, read with image_path_mode="relative".
    """
    _check_bad(bad, NEGBENCH_FAULTS)
    if bad and n_rows < 6:
        raise ValueError("faults need at least 6 rows")
    if "escaping_path" in bad and not relative_paths:
        raise ValueError("escaping_path needs relative_paths=True (basename mode cannot escape)")
    root = Path(root)
    rows = []
    for r in range(n_rows):
        name = negbench_image_name(r)
        _save_image(root / "val2017" / name, r // 2, "JPEG")
        rows.append(
            {
                "image_path": name if relative_paths else AUTHORS_PREFIX + name,
                "correct_answer": str(r % 4),
                **{f"caption_{k}": f"This image features object {r}-{k}." for k in range(4)},
                "correct_answer_template": NEGBENCH_TEMPLATES[r % 3],
            }
        )
    kept, problems = n_rows, 0
    if "unknown_template" in bad:
        rows[0]["correct_answer_template"] = "double-negative"
        kept, problems = kept - 1, problems + 1
    if "answer_out_of_range" in bad:
        rows[1]["correct_answer"] = "4"
        kept, problems = kept - 1, problems + 1
    if "non_numeric_answer" in bad:
        rows[2]["correct_answer"] = "two"
        kept, problems = kept - 1, problems + 1
    if "missing_image" in bad:
        rows[4]["image_path"] = rows[4]["image_path"].replace(".jpg", "_gone.jpg")
        kept, problems = kept - 1, problems + 1
    if "escaping_path" in bad:
        rows[5]["image_path"] = "../" + negbench_image_name(5)
        shutil.copy(root / "val2017" / negbench_image_name(5), root / negbench_image_name(5))
        kept, problems = kept - 1, problems + 1
    (root / "images").mkdir(parents=True, exist_ok=True)
    columns = [
        "image_path",
        "correct_answer",
        "caption_0",
        "caption_1",
        "caption_2",
        "caption_3",
        "correct_answer_template",
    ]
    with open(root / "images" / "COCO_val_mcq_llama3.1_rephrased.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    options = {"image_path_mode": "relative"} if relative_paths else {}
    return Written(root, 4 * kept, kept, problems, options)
