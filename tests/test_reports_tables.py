"""Report tables built from a synthetic run directory with known numbers.

The run is written by hand: three backbones (two families), a correlation benchmark with
skill tags, a Winoground-style benchmark and a multiple-choice benchmark with templates.
statistics / deltas hold chosen values (checked exactly, with their marks); per-item scores
are random but consistent (depict = (agree + vqascore) / 2), and the tables computed from
them are checked against scipy / numpy reference computations written here.
"""
from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats as sps

from pipeline.reports import tables
from pipeline.reports.finished_run import BackboneInfo, open_run
from pipeline.store.run_folder import output_files

BACKBONES = {"qwen3_5-27b": ("qwen3_5", "27B"), "internvl3_5-8b": ("internvl3_5", "8B"), "qwen3_5-4b": ("qwen3_5", "4B")}
METRICS = ["depict", "agree", "agree_unweighted", "agree_unweighted+vqascore", "soft_tifa_am", "soft_tifa_am+vqascore", "dsg", "vqascore", "mean_commitment"]
BASELINES = ["dsg", "soft_tifa_am", "vqascore"]
PROTOCOLS = {
    "genai": {"kind": "correlation", "statistics": ["srcc"], "breakdowns": ["tags"], "primary_statistic": "srcc", "tie_policy": "expected"},
    "wino": {"kind": "winoground", "statistics": ["text_acc", "image_acc", "group_acc"], "breakdowns": [], "primary_statistic": "group_acc", "tie_policy": "strict"},
    "neg": {"kind": "multiple_choice", "statistics": ["accuracy"], "breakdowns": ["template"], "primary_statistic": "accuracy", "tie_policy": "expected"},
}
TEMPLATES = ("affirmative", "negation", "hybrid")
N_RESAMPLES = 30

# statistics.parquet, subset "all": {backbone: {(benchmark, statistic): {metric: value}}}
ALL = {
    "qwen3_5-27b": {
        ("genai", "srcc"): {"dsg": 0.549, "soft_tifa_am": 0.546, "vqascore": 0.698, "agree": 0.671, "depict": 0.720,
                            "agree_unweighted": 0.650, "agree_unweighted+vqascore": 0.700, "soft_tifa_am+vqascore": 0.696, "claim_mean_am": 0.5},
        ("wino", "text_acc"): {"dsg": 0.520, "soft_tifa_am": 0.758, "vqascore": 0.832, "agree": 0.740, "depict": 0.822},
        ("wino", "image_acc"): {"dsg": 0.465, "soft_tifa_am": 0.718, "vqascore": 0.828, "agree": 0.740, "depict": 0.828},
        ("wino", "group_acc"): {"dsg": 0.445, "soft_tifa_am": 0.648, "vqascore": 0.755, "agree": 0.658, "depict": 0.745,
                                "soft_tifa_am+vqascore": 0.752},
        ("neg", "accuracy"): {"dsg": 0.347, "soft_tifa_am": 0.191, "vqascore": 0.847, "agree": 0.883, "depict": 0.869,
                              "soft_tifa_am+vqascore": 0.622},
    },
    "qwen3_5-4b": {  # no DSG statistics at all
        ("genai", "srcc"): {"soft_tifa_am": 0.600, "vqascore": 0.650, "agree": 0.640, "depict": 0.660},
        ("wino", "group_acc"): {"soft_tifa_am": 0.500, "vqascore": 0.600, "agree": 0.550, "depict": 0.600},
        ("neg", "accuracy"): {"soft_tifa_am": 0.200, "vqascore": 0.800, "agree": 0.850, "depict": 0.840},
    },
    "internvl3_5-8b": {  # no multiple-choice benchmark; Soft-TIFA-AM undefined (NaN) on genai
        ("genai", "srcc"): {"dsg": 0.500, "soft_tifa_am": float("nan"), "vqascore": 0.610, "agree": 0.590, "depict": 0.590},
        ("wino", "group_acc"): {"dsg": 0.300, "soft_tifa_am": 0.400, "vqascore": 0.500, "agree": 0.450, "depict": 0.480},
    },
}  # fmt: skip
SUBSETS = {  # qwen3_5-27b only: {(benchmark, subset): {metric: value}}
    ("genai", "basic"): {"dsg": 0.591, "soft_tifa_am": 0.661, "vqascore": 0.685, "depict": 0.698},
    ("genai", "advanced"): {"dsg": 0.427, "soft_tifa_am": 0.357, "vqascore": 0.607, "depict": 0.646},
    ("genai", "tag=attribute"): {"dsg": 0.562, "soft_tifa_am": 0.594, "vqascore": 0.700, "depict": 0.726},
    ("genai", "tag=counting"): {"dsg": 0.500, "soft_tifa_am": 0.450, "vqascore": 0.600, "depict": 0.590},
    ("neg", "template=affirmative"): {"dsg": 0.731, "soft_tifa_am": 0.483, "vqascore": 0.885, "agree": 0.912, "depict": 0.903},
    ("neg", "template=negation"): {"dsg": 0.100, "soft_tifa_am": 0.050, "vqascore": 0.850, "agree": 0.870, "depict": 0.870},
}
DELTAS = [  # benchmark, backbone, subset, statistic, baseline, delta, ci_low, ci_high, significant
    ("genai", "qwen3_5-27b", "all", "srcc", "vqascore", 0.022, 0.010, 0.034, True),
    ("genai", "qwen3_5-4b", "all", "srcc", "vqascore", 0.010, -0.010, 0.030, False),
    ("genai", "internvl3_5-8b", "all", "srcc", "vqascore", -0.020, float("nan"), float("nan"), None),
    ("wino", "qwen3_5-27b", "all", "group_acc", "vqascore", -0.010, -0.030, 0.010, False),
    ("neg", "qwen3_5-27b", "all", "accuracy", "vqascore", 0.022, 0.010, 0.030, True),
    ("genai", "qwen3_5-27b", "advanced", "srcc", "vqascore", 0.039, 0.020, 0.060, True),
    ("genai", "qwen3_5-27b", "tag=counting", "srcc", "vqascore", -0.010, -0.050, 0.030, False),
    ("neg", "qwen3_5-27b", "template=affirmative", "accuracy", "vqascore", 0.018, 0.005, 0.030, True),
]


def items_frame() -> pl.DataFrame:
    rng = np.random.default_rng(7)
    rows = []
    for prompt in range(12):
        tags = [["attribute"], ["counting"], ["attribute", "negation"]][prompt % 3]
        for image in range(2):
            rows.append(dict(item_id=f"genai/p{prompt}-{image}", benchmark="genai", caption=f"prompt {prompt}", group_id=f"p{prompt}",
                             human=float(rng.integers(1, 6)), tags=tags))  # fmt: skip
    for group in range(6):
        for image in range(2):
            for caption in range(2):
                rows.append(dict(item_id=f"wino/{group}-{image}{caption}", benchmark="wino", caption=f"wino {group} caption {caption}",
                                 group_id=f"w{group}", image_index=image, caption_index=caption, correct=image == caption, tags=[]))  # fmt: skip
    for group in range(8):
        for option in range(4):
            rows.append(dict(item_id=f"neg/{group}-{option}", benchmark="neg", caption=f"neg {group} option {option}", group_id=f"n{group}",
                             caption_index=option, correct=option == group % 4, template=TEMPLATES[group % 3], tags=[]))  # fmt: skip
    schema = {"item_id": pl.String, "benchmark": pl.String, "caption": pl.String, "group_id": pl.String, "human": pl.Float64,
              "image_index": pl.Int32, "caption_index": pl.Int32, "correct": pl.Boolean, "template": pl.String, "tags": pl.List(pl.String)}  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def scores_frame(items: pl.DataFrame, backbone: str, seed: int) -> pl.DataFrame:
    """Random per-item scores, consistent with the merges (depict = (agree + vqascore) / 2)."""
    if backbone == "internvl3_5-8b":
        items = items.filter(pl.col("benchmark") != "neg")
    rng = np.random.default_rng(seed)
    n = items.height
    base = {m: rng.uniform(0, 1, n) for m in ("agree", "agree_unweighted", "soft_tifa_am", "dsg", "vqascore", "mean_commitment")}
    base["depict"] = 0.5 * base["vqascore"] + 0.5 * base["agree"]
    base["agree_unweighted+vqascore"] = 0.5 * base["vqascore"] + 0.5 * base["agree_unweighted"]
    base["soft_tifa_am+vqascore"] = 0.5 * base["vqascore"] + 0.5 * base["soft_tifa_am"]
    frames = [
        items.select("item_id", "benchmark").with_columns(backbone=pl.lit(backbone), metric=pl.lit(m), score=pl.Series(base[m]), note=pl.lit(None, pl.String))
        for m in METRICS
    ]
    return pl.concat(frames)


P_T = {"genai": lambda prompt, q: 0.9 if q == 1 else (0.1 if prompt < 3 else 0.55 if prompt < 5 else 0.95)}


def records_frame(items: pl.DataFrame) -> pl.DataFrame:
    """qwen3_5-27b caption-only answers: genai 24 unique pairs (3 "no", 2 undecided); neg
    correct captions 2 of 8 "no" while every distractor says "no" (they must be left out)."""
    rows = []
    for item in items.iter_rows(named=True):
        if item["benchmark"] == "genai":
            prompt = int(item["group_id"][1:])
            answers = [(q, P_T["genai"](prompt, q)) for q in (1, 2)]
        elif item["benchmark"] == "neg":
            group = int(item["group_id"][1:])
            answers = [(1, (0.2 if group < 2 else 0.8) if item["correct"] else 0.2)]
        else:
            continue  # no records for wino: its cells must be missing
        for q, p in answers:
            rows.append(dict(item_id=item["item_id"], caption=item["caption"], question_set="depict", question_id=str(q),
                             question=f"question {q}", logp_yes_t=math.log(p), logp_no_t=math.log(1 - p)))  # fmt: skip
        rows.append(dict(item_id=item["item_id"], caption=item["caption"], question_set="dsg", question_id="1",
                         question="dsg question", logp_yes_t=None, logp_no_t=None))  # fmt: skip
    return pl.DataFrame(rows).with_columns(backbone=pl.lit("qwen3_5-27b"), logp_yes_v=pl.lit(-0.5), logp_no_v=pl.lit(-1.0))


def statistics_frame() -> pl.DataFrame:
    rows = []
    for backbone, by_column in ALL.items():
        for (benchmark, statistic), values in by_column.items():
            for metric, value in values.items():
                rows.append((benchmark, backbone, metric, "all", statistic, value, value - 0.05, value + 0.05, 100, None))
    for (benchmark, subset), values in SUBSETS.items():
        statistic = PROTOCOLS[benchmark]["primary_statistic"]
        for metric, value in values.items():
            rows.append((benchmark, "qwen3_5-27b", metric, subset, statistic, value, None, None, 40 if "tag" in subset else 3, None))
    columns = ["benchmark", "backbone", "metric", "subset", "statistic", "value", "ci_low", "ci_high", "n", "note"]
    return pl.DataFrame(rows, schema=columns, orient="row").with_columns(pl.col("n").cast(pl.Int64), pl.col("note").cast(pl.String))


def deltas_frame() -> pl.DataFrame:
    columns = ["benchmark", "backbone", "subset", "statistic", "baseline", "delta", "ci_low", "ci_high", "significant"]
    frame = pl.DataFrame(DELTAS, schema=columns, orient="row")
    return frame.with_columns(metric=pl.lit("depict"), n_groups=pl.lit(10, pl.Int64), significant=pl.col("significant").cast(pl.Boolean))


def manifest() -> dict:
    return {
        "config": {
            "sweep": {
                "run_name": "synthetic", "backbones": ["qwen3_5-27b", "internvl3_5-8b", "qwen3_5-4b"], "benchmarks": ["genai", "wino", "neg"],
                "metrics": METRICS, "baselines": BASELINES, "target": "depict", "lam": 0.5, "bootstrap": {"n_resamples": N_RESAMPLES, "seed": 0},
            },
            "backbones": {name: {"family": family, "size": size, "note": ""} for name, (family, size) in BACKBONES.items()} | {"generator": {"family": "x", "size": "1B"}},
            "benchmarks": {name: {"name": name, "protocol": protocol} for name, protocol in PROTOCOLS.items()},
        }
    }  # fmt: skip


def write_synthetic_run(run_dir) -> None:
    (run_dir / "scores").mkdir(parents=True)
    (run_dir / "records").mkdir()
    items = items_frame()
    items.write_parquet(run_dir / "items.parquet")
    for seed, backbone in enumerate(BACKBONES):
        scores_frame(items, backbone, seed).write_parquet(run_dir / "scores" / f"{backbone}.parquet")
    records_frame(items).write_parquet(run_dir / "records" / "qwen3_5-27b.parquet")
    statistics_frame().write_parquet(run_dir / "statistics.parquet")
    deltas_frame().write_parquet(run_dir / "deltas.parquet")
    mark_finished(run_dir)


def mark_finished(run_dir) -> None:
    """Mark the run finished the way a sweep does: every file listed with its digest."""
    finished = {**manifest(), "status": "finished", "run_id": "synthetic", "outputs": output_files(str(run_dir))}
    (run_dir / "manifest.json").write_text(json.dumps(finished))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("reports") / "runs" / "synthetic"
    write_synthetic_run(path)
    return path


@pytest.fixture(scope="module")
def run(run_dir):
    return open_run(str(run_dir))


def marks(cell: tables.Cell) -> str:
    return "bold" if cell.bold else "underline" if cell.underline else ""


# ---------------------------------------------------------------------------------------------
# Reading the run


def test_open_run_reads_what_the_run_holds(run):
    assert list(run.backbones) == ["qwen3_5-27b", "internvl3_5-8b", "qwen3_5-4b"]  # sweep order; the generator has no scores
    assert run.backbones["qwen3_5-4b"] == BackboneInfo("qwen3_5-4b", "qwen3_5", "4B", "")
    assert list(run.benchmarks) == ["genai", "wino", "neg"]
    assert run.benchmarks["neg"].protocol.tie_policy == "expected" and run.benchmarks["wino"].primary == "group_acc"
    assert "mean_commitment" not in run.metrics and run.target == "depict" and run.n_resamples == N_RESAMPLES
    assert run.ladder_order() == ["qwen3_5-4b", "qwen3_5-27b", "internvl3_5-8b"]  # families in sweep order, by size
    assert run.records("internvl3_5-8b") is None and run.records("qwen3_5-27b").height > 0
    assert run.problems == []


@pytest.mark.parametrize(("size", "billions"), [("27B", 27.0), ("E4B", 4.0), ("350M", 0.35), ("tiny", math.inf), ("", math.inf)])
def test_backbone_size_is_parsed_for_ordering(size, billions):
    assert BackboneInfo("x", size=size).size_value == billions


def test_open_run_names_the_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        open_run(str(tmp_path))
    (tmp_path / "manifest.json").write_text(json.dumps(manifest()))
    items_frame().drop("group_id").write_parquet(tmp_path / "items.parquet")
    with pytest.raises(ValueError, match=r"items.parquet: missing column\(s\) \['group_id'\]"):
        open_run(str(tmp_path))


def test_commitment_gain_reports_items_it_leaves_out(tmp_path):
    write_synthetic_run(tmp_path / "run")
    path = tmp_path / "run" / "scores" / "qwen3_5-27b.parquet"
    frame = pl.read_parquet(path)
    gap = (pl.col("item_id") == "genai/p0-0") & (pl.col("metric") == "mean_commitment")
    frame.with_columns(score=pl.when(gap).then(None).otherwise(pl.col("score"))).write_parquet(path)
    mark_finished(tmp_path / "run")
    run = open_run(str(tmp_path / "run"))
    table = tables.commitment_gain_table(run, n_resamples=N_RESAMPLES)
    assert "qwen3_5-27b / genai: 1 item(s) without a human value or one of the three scores left out." in table.notes
    genai = _wide(run, "qwen3_5-27b", "genai").drop_nulls("mean_commitment")
    expected = sps.spearmanr(genai["depict"], genai["human"])[0] - sps.spearmanr(genai["agree_unweighted+vqascore"], genai["human"])[0]
    assert table.cell("qwen3_5-27b", "genai:all").value == pytest.approx(expected, abs=1e-12)


def test_rows_without_a_key_field_are_reported_and_skipped(tmp_path):
    write_synthetic_run(tmp_path / "run")
    path = tmp_path / "run" / "scores" / "qwen3_5-4b.parquet"
    frame = pl.read_parquet(path)
    frame.with_columns(metric=pl.when(pl.int_range(pl.len()) == 3).then(None).otherwise(pl.col("metric"))).write_parquet(path)
    mark_finished(tmp_path / "run")
    run = open_run(str(tmp_path / "run"))
    assert run.problems == [f"{path}: row 3 has no metric; skipped"]
    assert run.scores.filter(pl.col("backbone") == "qwen3_5-4b").height == frame.height - 1


# ---------------------------------------------------------------------------------------------
# Table 2


def test_comparison_table_values_order_and_marks(run):
    table = {t.name: t for t in tables.comparison_tables(run)}["comparison_qwen3_5-27b"]
    # baselines in config order, other metrics (config order, then the unconfigured one), Agree, DEPICT
    assert [r.labels[0] for r in table.rows] == [
        "DSG", "Soft-TIFA-AM", "VQAScore", "Agree (unweighted)", "Agree (unweighted)+VQA", "Soft-TIFA-AM+VQA",
        "Claim mean (AM)", "Agree", "DEPICT",
    ]  # fmt: skip
    assert [c.key for c in table.columns] == ["genai:srcc", "wino:text_acc", "wino:image_acc", "wino:group_acc", "neg:accuracy"]
    assert table.cell("DEPICT", "genai:srcc").value == 0.720 and marks(table.cell("DEPICT", "genai:srcc")) == "bold"
    assert marks(table.cell("Agree (unweighted)+VQA", "genai:srcc")) == "underline"  # 0.700 > VQAScore's 0.698
    # a tie for best: both bold, the next value underlined
    image = {r.labels[0]: marks(r.cells["wino:image_acc"]) for r in table.rows if not r.cells["wino:image_acc"].missing}
    assert image == {"DSG": "", "Soft-TIFA-AM": "", "VQAScore": "bold", "Agree": "underline", "DEPICT": "bold"}
    assert marks(table.cell("Agree", "neg:accuracy")) == "bold" and marks(table.cell("DEPICT", "neg:accuracy")) == "underline"
    assert table.cell("Agree (unweighted)", "wino:group_acc").missing  # not in statistics: missing, not 0
    assert table.cell("DSG", "genai:srcc").ci == pytest.approx((0.499, 0.599))
    assert (table.backbones, table.benchmarks, table.paper) == (["qwen3_5-27b"], ["genai", "wino", "neg"], "Table 2")


def test_comparison_table_shows_missing_cells_as_missing(run):
    by_name = {t.name: t for t in tables.comparison_tables(run)}
    small = by_name["comparison_qwen3_5-4b"]
    assert all(cell.missing for cell in small.rows[0].cells.values()) and small.rows[0].labels == ["DSG"]
    intern = by_name["comparison_internvl3_5-8b"]
    assert intern.cell("DEPICT", "neg:accuracy").missing and intern.cell("Soft-TIFA-AM", "genai:srcc").missing  # absent; NaN
    assert intern.benchmarks == ["genai", "wino"]
    assert intern.notes == ["neg: no statistics for internvl3_5-8b in this run (shown as missing)."]
    genai = {r.labels[0]: marks(r.cells["genai:srcc"]) for r in intern.rows if not r.cells["genai:srcc"].missing}
    assert genai == {"DSG": "", "VQAScore": "bold", "Agree": "underline", "DEPICT": "underline"}


# ---------------------------------------------------------------------------------------------
# Tables 7 / 8, 9, 10


def test_size_ladder_groups_by_family_and_stars_only_significant_deltas(run):
    table = tables.size_ladder_table(run)
    assert [c.key for c in table.columns] == ["dsg", "soft_tifa_am", "vqascore", "depict", "delta", "baseline"]
    assert table.sections == ["genai (SRCC)", "wino (Group)", "neg (Acc.)"]
    genai = [r for r in table.rows if r.section == "genai (SRCC)"]
    assert [r.labels for r in genai] == [["qwen3_5", "qwen3_5-4b"], ["qwen3_5", "qwen3_5-27b"], ["internvl3_5", "internvl3_5-8b"]]
    big, small, intern = (table.cell(n, "delta", "genai (SRCC)") for n in ("qwen3_5-27b", "qwen3_5-4b", "internvl3_5-8b"))
    assert (big.value, big.ci, big.star) == (0.022, (0.010, 0.034), True)
    assert (small.value, small.star) == (0.010, False)
    assert (intern.value, intern.ci, intern.star) == (-0.020, None, False)  # no interval: never starred
    assert table.cell("qwen3_5-27b", "baseline", "genai (SRCC)").text == "VQAScore"
    assert [marks(table.cell("qwen3_5-27b", m, "genai (SRCC)")) for m in ("dsg", "soft_tifa_am", "vqascore", "depict")] == ["", "", "underline", "bold"]
    assert table.cell("qwen3_5-4b", "dsg", "genai (SRCC)").missing
    row = next(r for r in table.rows if r.section == "neg (Acc.)" and r.labels[1] == "internvl3_5-8b")
    assert all(c.missing for c in row.cells.values())  # the backbone lacks the benchmark
    assert table.cell("qwen3_5-27b", "delta", "wino (Group)").star is False
    assert table.backbones == ["qwen3_5-4b", "qwen3_5-27b", "internvl3_5-8b"] and table.benchmarks == ["genai", "wino", "neg"]


def test_template_table(run):
    (table,) = tables.template_tables(run)
    assert table.name == "templates_neg" and table.sections == ["Affirmative", "Negation"]
    assert [c.key for c in table.columns][:5] == ["dsg", "soft_tifa_am", "vqascore", "agree", "depict"]
    assert table.cell("qwen3_5-27b", "agree", "Affirmative").value == 0.912
    assert marks(table.cell("qwen3_5-27b", "agree", "Affirmative")) == "bold"
    assert marks(table.cell("qwen3_5-27b", "depict", "Affirmative")) == "underline"
    assert [marks(table.cell("qwen3_5-27b", m, "Negation")) for m in ("vqascore", "agree", "depict")] == ["underline", "bold", "bold"]
    assert table.cell("qwen3_5-27b", "n", "Affirmative").value == 3
    assert table.cell("qwen3_5-27b", "delta", "Affirmative").star and not table.cell("qwen3_5-27b", "delta", "Negation").star
    assert table.cell("qwen3_5-27b", "delta", "Negation").missing
    assert table.backbones == ["qwen3_5-27b"]


def test_skill_table(run):
    (table,) = tables.skill_tables(run)
    assert table.name == "skills_genai_qwen3_5-27b"
    assert [(r.section, r.labels[0]) for r in table.rows] == [
        ("Overall", "All items"), ("Basic vs advanced", "Basic only (no advanced tag)"),
        ("Basic vs advanced", "Advanced (any advanced tag)"), ("Skills", "Attribute"), ("Skills", "Counting"),
    ]  # fmt: skip
    assert table.cell("Advanced (any advanced tag)", "depict").value == 0.646
    assert table.cell("Advanced (any advanced tag)", "delta").star and not table.cell("Counting", "delta").star
    assert marks(table.cell("Counting", "vqascore")) == "bold" and marks(table.cell("Counting", "depict")) == "underline"
    assert table.cell("Attribute", "n").value == 40


# ---------------------------------------------------------------------------------------------
# Table 12: per-item numbers against reference computations


def _wide(run, backbone, benchmark):
    scores = run.scores.filter((pl.col("backbone") == backbone) & (pl.col("benchmark") == benchmark))
    wide = scores.pivot(on="metric", index="item_id", values="score")
    return run.items.filter(pl.col("benchmark") == benchmark).join(wide, on="item_id").sort("item_id")


def _winoground_group(frame: pl.DataFrame, metric: str) -> dict[str, float]:
    out = {}
    for (group,), g in frame.group_by("group_id"):
        s = {(r["image_index"], r["caption_index"]): r[metric] for r in g.iter_rows(named=True)}
        out[group] = float(s[0, 0] > s[0, 1] and s[1, 1] > s[1, 0] and s[0, 0] > s[1, 0] and s[1, 1] > s[0, 1])
    return out


def _choice(frame: pl.DataFrame, metric: str) -> dict[str, float]:
    best = frame.sort(metric, descending=True).group_by("group_id", maintain_order=True).first()
    return {r["group_id"]: float(r["correct"]) for r in best.iter_rows(named=True)}


def test_commitment_gain_matches_reference(run):
    table = tables.commitment_gain_table(run, n_resamples=N_RESAMPLES)
    gains = {}
    for backbone in ("qwen3_5-27b", "internvl3_5-8b"):
        genai = _wide(run, backbone, "genai")
        low = genai["mean_commitment"] <= np.quantile(genai["mean_commitment"], 0.25)
        for subset, frame in (("all", genai), ("least", genai.filter(low))):
            expected = sps.spearmanr(frame["depict"], frame["human"])[0] - sps.spearmanr(frame["agree_unweighted+vqascore"], frame["human"])[0]
            assert table.cell(backbone, f"genai:{subset}").value == pytest.approx(expected, abs=1e-12)
            gains[backbone, "genai", subset] = expected
        wino = _wide(run, backbone, "wino")
        weighted, unweighted = _winoground_group(wino, "depict"), _winoground_group(wino, "agree_unweighted+vqascore")
        commitment = dict(wino.group_by("group_id").agg(pl.col("mean_commitment").mean()).iter_rows())
        groups = sorted(commitment)
        cut = np.quantile([commitment[g] for g in groups], 0.25)
        for subset, chosen in (("all", groups), ("least", [g for g in groups if commitment[g] <= cut])):
            expected = np.mean([weighted[g] - unweighted[g] for g in chosen])
            assert table.cell(backbone, f"wino:{subset}").value == pytest.approx(expected, abs=1e-12)
            gains[backbone, "wino", subset] = expected
    neg = _wide(run, "qwen3_5-27b", "neg")
    expected_neg = np.mean([_choice(neg, "depict")[g] - _choice(neg, "agree_unweighted+vqascore")[g] for g in sorted(set(neg["group_id"]))])
    assert table.cell("qwen3_5-27b", "neg:all").value == pytest.approx(expected_neg, abs=1e-12)

    assert table.cell("internvl3_5-8b", "neg:all").missing  # the backbone has no such benchmark
    mean_all = np.mean([gains["qwen3_5-27b", "genai", "all"], gains["qwen3_5-27b", "wino", "all"], expected_neg])
    assert table.cell("qwen3_5-27b", "mean_all").value == pytest.approx(mean_all, abs=1e-12)
    improved = sum(g > 0.01 for g in (gains["internvl3_5-8b", "genai", "all"], gains["internvl3_5-8b", "wino", "all"]))
    assert table.cell("internvl3_5-8b", "improved").text == f"{improved}/2"
    assert tables.improved_count([0.005, 0.0101, -0.2, 0.01]) == "1/4"  # above one point, strictly
    assert table.columns[0].scale == 100 and table.columns[0].signed
    assert any("internvl3_5-8b / neg: not computed" in note for note in table.notes)
    for row in table.rows:  # a star exactly where the gain's interval excludes zero
        for column in table.columns:
            cell = row.cells.get(column.key)
            if cell is not None and cell.ci is not None:
                assert cell.star == (cell.ci[0] > 0 or cell.ci[1] < 0)


# ---------------------------------------------------------------------------------------------
# Table 13


def test_merge_table_bolds_the_better_merge_only(run):
    table = {t.name: t for t in tables.merge_tables(run)}["merge_qwen3_5-27b"]
    assert [c.key for c in table.columns] == ["vqascore", "agree", "soft_tifa_am", "depict", "soft_tifa_am+vqascore"]
    assert [r.labels for r in table.rows] == [["genai", "SRCC"], ["wino", "Group"], ["neg", "Acc."]]
    assert [(marks(r.cells["depict"]), marks(r.cells["soft_tifa_am+vqascore"])) for r in table.rows] == [
        ("bold", ""), ("", "bold"), ("bold", "")
    ]
    assert not any(r.cells[m].bold or r.cells[m].underline for r in table.rows for m in ("vqascore", "agree", "soft_tifa_am"))
    assert table.cell("wino", "soft_tifa_am+vqascore").value == 0.752


# ---------------------------------------------------------------------------------------------
# Table 15


def test_answer_distribution_counts_unique_pairs_of_correct_captions(run):
    table = tables.answer_distribution_table(run, n_resamples=N_RESAMPLES)
    assert table.sections == ["qwen3_5-27b"]
    genai = {k: table.cell("genai", k) for k in ("unique_q", "no_share", "undecided")}
    assert genai["unique_q"].value == 24  # 12 captions x 2 questions; each caption's second image adds nothing
    assert genai["no_share"].value == pytest.approx(3 / 24) and genai["undecided"].value == pytest.approx(2 / 24)
    low, high = genai["no_share"].ci
    assert 0 <= low <= 3 / 24 <= high <= 1
    assert table.cell("neg", "unique_q").value == 8 and table.cell("neg", "no_share").value == pytest.approx(2 / 8)
    assert all(table.cell("wino", k).missing for k in ("unique_q", "no_share", "undecided"))
    assert table.notes == ["internvl3_5-8b: the run stored no per-question records.", "qwen3_5-4b: the run stored no per-question records."]
    assert table.benchmarks == ["genai", "neg"]


# ---------------------------------------------------------------------------------------------
# Figure 9's data


def test_lambda_sensitivity_matches_reference(run):
    data = tables.lambda_sensitivity(run, "qwen3_5-27b")
    assert data["lam"].unique().sort().to_list() == list(tables.LAMBDAS)
    genai, wino, neg = (_wide(run, "qwen3_5-27b", b) for b in ("genai", "wino", "neg"))
    for lam in (0.0, 0.35, 0.5, 1.0):
        value = {r["benchmark"]: r["value"] for r in data.filter(pl.col("lam") == lam).iter_rows(named=True)}
        merged = {b: f.with_columns(m=lam * pl.col("vqascore") + (1 - lam) * pl.col("agree")) for b, f in (("genai", genai), ("wino", wino), ("neg", neg))}
        assert value["genai"] == pytest.approx(sps.spearmanr(merged["genai"]["m"], merged["genai"]["human"])[0], abs=1e-12)
        assert value["wino"] == pytest.approx(np.mean(list(_winoground_group(merged["wino"], "m").values())))
        assert value["neg"] == pytest.approx(np.mean(list(_choice(merged["neg"], "m").values())))
    half = {r["benchmark"]: r["value"] for r in data.filter(pl.col("lam") == 0.5).iter_rows(named=True)}
    assert half["genai"] == pytest.approx(sps.spearmanr(genai["depict"], genai["human"])[0], abs=1e-12)  # lam 0.5 is DEPICT
    (table,) = [t for t in tables.lambda_tables(run, {"qwen3_5-27b": data, "internvl3_5-8b": data.head(0), "qwen3_5-4b": data.head(0)})]
    assert table.name == "lambda_qwen3_5-27b" and len(table.rows) == 21
    assert table.cell("0.50", "genai").value == half["genai"]
    assert tables.lambda_sensitivity(run, "internvl3_5-8b")["benchmark"].unique().sort().to_list() == ["genai", "wino"]


# ---------------------------------------------------------------------------------------------
# Marks


@given(st.lists(st.one_of(st.none(), st.integers(-5, 5).map(lambda i: i / 4)), min_size=0, max_size=8))
def test_marks_bold_every_tie_for_best_and_underline_the_next_value(values):
    cells = [tables.number(v) for v in values]
    tables.mark_best(cells, tables.Column("x", "x"))
    present = sorted({v for v in values if v is not None}, reverse=True)
    for value, cell in zip(values, cells):
        if value is None or len([v for v in values if v is not None]) < 2:
            assert not cell.bold and not cell.underline
        else:
            assert cell.bold == (value == present[0])
            assert cell.underline == (len(present) > 1 and value == present[1])


def test_marks_compare_displayed_values():
    cells = [tables.number(0.72049), tables.number(0.7198), tables.number(0.7101)]  # 0.720, 0.720, 0.710 as printed
    tables.mark_best(cells, tables.Column("x", "x", digits=3))
    assert [marks(c) for c in cells] == ["bold", "bold", "underline"]
    assert tables.number(float("nan")).missing and tables.number(0.1, float("nan"), 0.2).ci is None


def test_comparison_table_lists_kendall_and_pearson_when_the_run_has_them(tmp_path):
    write_synthetic_run(tmp_path)
    statistics = pl.read_parquet(tmp_path / "statistics.parquet")
    extra = statistics.filter((pl.col("benchmark") == "genai") & (pl.col("statistic") == "srcc")).with_columns(
        statistic=pl.lit("kendall"), value=pl.col("value") * 0.8
    )
    pl.concat([statistics, extra]).write_parquet(tmp_path / "statistics.parquet")
    mark_finished(tmp_path)  # edited after the run finished: mark it finished again
    table = {t.name: t for t in tables.comparison_tables(open_run(str(tmp_path)))}["comparison_qwen3_5-27b"]
    assert [c.key for c in table.columns][:2] == ["genai:srcc", "genai:kendall"]
    assert "genai:pearson" not in [c.key for c in table.columns]  # not in this run: no empty column
    assert tables.statistic_label("kendall") == "Kendall tau-b" and tables.statistic_label("pearson") == "Pearson"
    assert table.cell("DEPICT", "genai:kendall").value == pytest.approx(0.720 * 0.8)
