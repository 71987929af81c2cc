"""The open-share figure across runs, from run folders written here with known numbers.

Each synthetic run holds the demo's real items and questions at its share (the demo loader's),
and statistics with values chosen per run, so the figure's table can be checked against each
run's own files read directly, and the realised share against the demo world's own count.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from operators.demo_world import FIXED_ITEMS
from pipeline.benchmarks.demo import load as load_demo
from pipeline.metaeval import DELTAS_SCHEMA, STATISTICS_SCHEMA
from pipeline.reports import open_share
from pipeline.reports.figures import open_share_plot
from pipeline.reports.finished_run import open_run
from pipeline.reports.write import write_open_share
from pipeline.store.run_folder import output_files

REPO = Path(__file__).resolve().parent.parent
BACKBONES = ["micro", "oracle"]
METRICS = ["depict", "agree", "soft_tifa_am", "hard_fixed_yes", "dsg", "vqascore", "mean_commitment"]
BASELINES = ["dsg", "soft_tifa_am", "vqascore"]
PARTS = {"demo": "correlation", "demo_mcq": "mcq"}
PROTOCOLS = {
    "demo": {"kind": "correlation", "statistics": ["srcc", "plcc"], "breakdowns": ["tags"], "primary_statistic": "srcc", "tie_policy": "expected"},
    "demo_mcq": {"kind": "multiple_choice", "statistics": ["accuracy"], "breakdowns": [], "primary_statistic": "accuracy", "tie_policy": "expected"},
}
SHARES = (0.25, 0.0, 0.5)  # given out of order: the figure sorts by share


def config(root: str, share: float, name: str) -> dict:
    """A manifest's resolved config as a sweep writes it (the parts the reports read, and some more)."""
    data_root = f"{root}/datasets"
    return {
        "sweep": {
            "run_name": name, "name": "demo", "root": root, "store": f"{root}/store", "data_root": data_root,
            "backbones": BACKBONES, "benchmarks": list(PARTS), "metrics": METRICS, "baselines": BASELINES, "target": "depict",
            "lam": 0.5, "bootstrap": {"n_resamples": 40, "seed": 0, "confidence": 0.95},
            "questions": {"source": "benchmark", "sets": ["depict", "dsg"], "open_share": share, "max_questions": 32},
            "compute": {"rows_per_part": 64, "num_cpus": None}, "lease": {"ttl_s": 600.0}, "window_items": 50000,
        },
        "backbones": {b: {"name": b, "family": b, "size": "1M", "model_id": f"model/{b}", "note": ""} for b in BACKBONES},
        "benchmarks": {
            b: {"name": b, "loader": "demo", "root": f"{data_root}/demo", "options": {"open_share": share, "part": part}, "protocol": PROTOCOLS[b]}
            for b, part in PARTS.items()
        },
        "prompts": {"version": "v1"},
    }  # fmt: skip


def statistics(share: float) -> pl.DataFrame:
    """Primary statistics that differ per run and per row, plus rows the figure must leave out
    (a non-primary statistic, a subset); at share 0 one value is undefined (NaN)."""
    rng = np.random.default_rng(int(share * 100))
    rows = []
    for benchmark, protocol in PROTOCOLS.items():
        for backbone in BACKBONES:
            for metric in METRICS[:-1]:
                value = float(rng.uniform(0.2, 0.9))
                if share == 0 and (benchmark, backbone, metric) == ("demo", "micro", "dsg"):
                    value = float("nan")
                rows.append((benchmark, backbone, metric, "all", protocol["primary_statistic"], value, value - 0.1, value + 0.05, 24, None))
                rows.append((benchmark, backbone, metric, "tag=count", protocol["primary_statistic"], 0.0, None, None, 5, None))
                if benchmark == "demo":
                    rows.append((benchmark, backbone, metric, "all", "plcc", -1.0, None, None, 24, None))
    return pl.DataFrame(rows, schema=list(STATISTICS_SCHEMA), orient="row").cast(STATISTICS_SCHEMA)


def write_run(run_dir: Path, share: float, *, edit=None) -> Path:
    """A finished run folder at `share`; `edit(config)` changes its manifest's config."""
    (run_dir / "scores").mkdir(parents=True)
    data_root = run_dir.parent / "datasets"
    items, questions = [], []
    for benchmark, part in PARTS.items():
        loaded = load_demo(str(data_root / benchmark), part=part, open_share=share)
        items.append(pl.from_arrow(loaded.items))
        questions.append(pl.from_arrow(loaded.questions))
    items_frame = pl.concat(items)
    items_frame.write_parquet(run_dir / "items.parquet")
    pl.concat(questions).unique(["caption", "question_set", "question_id"], maintain_order=True).write_parquet(run_dir / "questions.parquet")
    for backbone in BACKBONES:
        scores = items_frame.select("item_id", "benchmark").join(pl.DataFrame({"metric": METRICS}), how="cross")
        scores.with_columns(backbone=pl.lit(backbone), score=pl.lit(0.5), note=pl.lit(None, pl.String)).select(
            "item_id", "benchmark", "backbone", "metric", "score", "note"
        ).write_parquet(run_dir / "scores" / f"{backbone}.parquet")
    statistics(share).write_parquet(run_dir / "statistics.parquet")
    pl.DataFrame(schema=DELTAS_SCHEMA).write_parquet(run_dir / "deltas.parquet")
    cfg = copy.deepcopy(config(str(run_dir.parent), share, run_dir.name))  # an edit must not reach the module's constants
    if edit is not None:
        edit(cfg)
    manifest = {"config": cfg, "status": "finished", "run_id": run_dir.name, "git_commit": "0" * 40, "outputs": output_files(str(run_dir))}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return run_dir


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("open_share")
    return [write_run(root / "runs" / f"open-{share:g}", share) for share in SHARES]


@pytest.fixture(scope="module")
def runs(run_dirs):
    return [open_run(str(d)) for d in run_dirs]


@pytest.fixture(scope="module")
def data(runs):
    return open_share.open_share_data(runs)[0]


def manifest_share(url: str) -> float:
    return json.loads((Path(url) / "manifest.json").read_text())["config"]["sweep"]["questions"]["open_share"]


# ---------------------------------------------------------------------------------------------
# The numbers


def test_one_row_per_share_backbone_metric_and_statistic_equal_to_each_runs_file(data, run_dirs):
    keys = ["share", "backbone", "benchmark", "metric", "statistic"]
    assert data.height == data.unique(keys).height
    expected_rows = 0
    for run_dir in run_dirs:
        stats = pl.read_parquet(run_dir / "statistics.parquet")
        primary = stats.filter((pl.col("subset") == "all") & (pl.col("statistic") == pl.col("benchmark").replace_strict({b: p["primary_statistic"] for b, p in PROTOCOLS.items()})))
        expected_rows += primary.height
        mine = data.filter(pl.col("run") == str(run_dir))
        assert set(mine["share"]) == {manifest_share(str(run_dir))}  # each run's points sit at its own share
        joined = primary.join(mine, on=["benchmark", "backbone", "metric", "statistic"], how="left", suffix="_fig")
        assert joined.height == mine.height == primary.height
        for r in joined.iter_rows(named=True):
            for column in ("value", "ci_low", "ci_high"):
                a, b = r[column], r[f"{column}_fig"]
                assert (a is None and b is None) or (math.isnan(a) and math.isnan(b)) or a == b, (run_dir.name, r["benchmark"], r["metric"], column)
            assert r["n"] == r["n_fig"]
    assert data.height == expected_rows
    assert set(data["statistic"]) == {"srcc", "accuracy"}  # plcc and the tag subset are left out


def test_rows_are_ordered_by_benchmark_backbone_metric_then_share(data):
    assert data["benchmark"].unique(maintain_order=True).to_list() == ["demo", "demo_mcq"]
    block = data.filter((pl.col("benchmark") == "demo") & (pl.col("backbone") == "micro"))
    assert block["metric"].unique(maintain_order=True).to_list() == ["dsg", "soft_tifa_am", "vqascore", "hard_fixed_yes", "agree", "depict"]
    assert block.filter(pl.col("metric") == "depict")["share"].to_list() == sorted(SHARES)


def _world_captions() -> dict:
    correlation, winoground, mcq = FIXED_ITEMS
    captions = [p.caption for p in correlation] + [c for row in mcq for c in (row.correct, *row.distractors)]
    return {c.text: c for c in captions}


def test_realised_share_counts_the_open_questions_the_world_adds(runs):
    world = _world_captions()
    for run in runs:
        share = open_share.open_share(run)
        realised, notes = open_share.realised_shares(run)
        assert notes == []
        for benchmark in PARTS:
            captions = [world[c] for c in set(run.items.filter(pl.col("benchmark") == benchmark)["caption"].to_list())]
            opened = sum(len(c.open_questions(share)) for c in captions)
            asked = sum(len(c.facts) for c in captions) + opened
            assert realised[benchmark] == pytest.approx(opened / asked, abs=1e-12), (share, benchmark)
            if share == 0:
                assert realised[benchmark] == 0
            else:  # captions cap the share: never above it, and this demo's reach a good part of it
                assert 0.5 * share < realised[benchmark] <= share + 0.05


def test_realised_share_is_not_guessed_for_captions_outside_the_demo(tmp_path):
    run_dir = write_run(tmp_path / "runs" / "photo", 0.25)
    items = pl.read_parquet(run_dir / "items.parquet")
    items.with_columns(caption=pl.when(pl.int_range(pl.len()) == 0).then(pl.lit("a dog on a sofa")).otherwise(pl.col("caption"))).write_parquet(run_dir / "items.parquet")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, "outputs": output_files(str(run_dir))}))
    realised, notes = open_share.realised_shares(open_run(str(run_dir)))
    assert realised["demo"] is None and realised["demo_mcq"] is not None
    assert notes == [f"{run_dir}: demo: caption 'a dog on a sofa' is not a demo caption, so its open questions cannot be told apart; realised share not measured"]


# ---------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("sweep", "bootstrap", "n_resamples"), 2000),
        (("sweep", "backbones"), ["micro"]),
        (("sweep", "metrics"), METRICS[:3]),
        (("benchmarks", "demo", "protocol", "tie_policy"), "strict"),
        (("backbones", "micro", "model_id"), "model/other"),
        (("prompts", "version"), "v2"),
    ],
)
def test_runs_that_differ_in_more_than_the_share_are_refused_naming_the_difference(tmp_path, run_dirs, path, value):
    def edit(cfg):
        node = cfg
        for key in path[:-1]:
            node = node[key]
        before = copy.deepcopy(node[path[-1]])
        node[path[-1]] = value
        edit.before = before

    other = write_run(tmp_path / "runs" / "other", 0.4, edit=edit)
    with pytest.raises(open_share.RunsDiffer) as raised:
        open_share.check_comparable([open_run(str(run_dirs[0])), open_run(str(other))])
    dotted = ".".join(path)
    assert str(raised.value).startswith("the runs differ in more than questions.open_share: ")
    assert f"{dotted}: {edit.before!r} in {run_dirs[0]} but {value!r} in {other}" in str(raised.value)


def test_where_a_run_ran_may_differ(tmp_path, run_dirs):
    def edit(cfg):
        cfg["sweep"]["compute"]["rows_per_part"] = 8
        cfg["sweep"]["lease"]["ttl_s"] = 60.0
        cfg["benchmarks"]["demo"]["root"] = "s3://elsewhere/demo"

    other = write_run(tmp_path / "elsewhere" / "runs" / "moved", 0.4, edit=edit)  # another root, store, data_root and name
    open_share.check_comparable([open_run(str(run_dirs[0])), open_run(str(other))])


def test_one_run_or_a_repeated_share_is_refused(tmp_path, runs):
    with pytest.raises(open_share.RunsDiffer, match="at least two runs, got 1"):
        open_share.check_comparable(runs[:1])
    again = write_run(tmp_path / "runs" / "again", SHARES[0])
    with pytest.raises(open_share.RunsDiffer, match=f"two runs have questions.open_share=0.25: {runs[0].url} and {again}"):
        open_share.check_comparable([runs[0], open_run(str(again))])


def test_a_run_without_the_setting_is_refused(tmp_path):
    run_dir = write_run(tmp_path / "runs" / "old", 0.0, edit=lambda cfg: cfg["sweep"]["questions"].pop("open_share"))
    with pytest.raises(ValueError, match=r"manifest.json: config has no number at sweep.questions.open_share"):
        open_share.open_share(open_run(str(run_dir)))


def load_job():
    spec = importlib.util.spec_from_file_location("tables_job", REPO / "jobs" / "tables.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


def test_the_job_refuses_mismatched_or_unfinished_runs_with_exit_2(tmp_path, run_dirs, capsys):
    job = load_job()
    other = write_run(tmp_path / "runs" / "other", 0.4, edit=lambda cfg: cfg["sweep"]["bootstrap"].update(n_resamples=2000))
    assert job.main([f"runs=[{run_dirs[0]},{other}]", "figure=open_share", f"out={tmp_path / 'fig'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the runs differ in more than questions.open_share: sweep.bootstrap.n_resamples: 40 in ") and err.count("\n") == 1
    unfinished = write_run(tmp_path / "runs" / "unfinished", 0.4)
    manifest = json.loads((unfinished / "manifest.json").read_text())
    (unfinished / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    assert job.main([f"runs=[{run_dirs[0]},{unfinished}]", "figure=open_share", f"out={tmp_path / 'fig'}"]) == 2
    assert f"{unfinished} is not a finished run" in capsys.readouterr().err
    assert not (tmp_path / "fig").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["runs=[a,b]", "out=o"], "runs= needs figure= one of ['open_share'], got None"),
        (["runs=[a,b]", "figure=forest", "out=o"], "runs= needs figure= one of ['open_share'], got 'forest'"),
        (["runs=[a]", "figure=open_share", "out=o"], "runs= needs at least two runs, got ['a']"),
        (["runs=[a,b]", "figure=open_share"], "runs= needs out=<dir>"),
        (["runs=[a,b]", "run=a", "figure=open_share", "out=o"], "not both"),
        (["runs=[a,b]", "figure=open_share", "out=o", "n_resamples=50"], "n_resamples= applies to one run's tables"),
        (["run=a", "figure=open_share"], "figure= go with runs=[...]"),
    ],
)
def test_the_job_checks_its_arguments_before_reading_runs(argv, message, capsys):
    assert load_job().main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_job_parses_lists():
    args = load_job().parse_args(["runs=[r1, r2,r3]", "figure=open_share", "out=o", "metrics=[depict,dsg]", "formats=md"])
    assert args == {"runs": ["r1", "r2", "r3"], "figure": "open_share", "out": "o", "metrics": ["depict", "dsg"], "formats": ["md"], "n_resamples": None}


# ---------------------------------------------------------------------------------------------
# The figure, the table and the files


def _lines(ax) -> dict[str, object]:
    return {line.get_label(): line for line in ax.lines if not line.get_label().startswith("_")}


def test_plot_draws_each_metric_at_its_runs_shares(data):
    metrics = ["depict", "dsg", "soft_tifa_am"]
    plot = open_share_plot(data, metrics)
    assert plot.name == "open_share" and plot.benchmarks == ["demo", "demo_mcq"] and plot.backbones == BACKBONES
    for ax, benchmark in zip(plot.figure.axes, plot.benchmarks):
        lines = _lines(ax)
        assert sorted(lines) == sorted(f"{b} {m}" for b in BACKBONES for m in metrics)
        for label, line in lines.items():
            backbone, metric = label.split(" ")
            rows = data.filter((pl.col("benchmark") == benchmark) & (pl.col("backbone") == backbone) & (pl.col("metric") == metric)).sort("share")
            x = np.asarray(line.get_xdata(), dtype=float)
            assert np.allclose(x - x.mean() + np.mean(rows["share"].to_numpy()), rows["share"].to_numpy(), atol=1e-12), label  # one offset per line
            assert np.abs(x - rows["share"].to_numpy()).max() < 0.05, label
            expected = rows["value"].to_numpy()
            assert np.array_equal(np.asarray(line.get_ydata(), dtype=float), expected, equal_nan=True), label
        realised = dict(data.filter(pl.col("benchmark") == benchmark).select("share", "realised_share").unique().iter_rows())
        ticks = [t.get_text() for t in ax.get_xticklabels()]
        assert ticks == [f"{s:g}\n({realised[s]:.2f})" for s in sorted(SHARES)]
        finite = data.filter((pl.col("benchmark") == benchmark) & pl.col("metric").is_in(metrics) & pl.col("value").is_not_nan())
        assert len(ax.containers) == finite.height  # one error bar per point with an interval
    labels = [t.get_text() for t in plot.figure.legends[0].get_texts()]
    assert labels == ["DEPICT", "DSG", "Soft-TIFA-AM", "micro", "oracle"]
    assert plot.png().startswith(b"\x89PNG")


def test_figure_metrics_default_and_choice(runs):
    assert open_share.figure_metrics(runs[0]) == ["dsg", "soft_tifa_am", "vqascore", "hard_fixed_yes", "depict"]
    assert open_share.figure_metrics(runs[0], ["agree", "depict"]) == ["agree", "depict"]
    with pytest.raises(ValueError, match=r"metrics \['nope'\] are not among the runs' metrics"):
        open_share.figure_metrics(runs[0], ["nope"])


def test_table_shows_every_run_per_share_column(data):
    table = open_share.open_share_table(data)
    assert [c.label for c in table.columns] == ["share 0", "share 0.25", "share 0.5"]
    assert table.sections == ["demo (SRCC)", "demo_mcq (Acc.)"]
    for r in data.iter_rows(named=True):
        section = "demo (SRCC)" if r["benchmark"] == "demo" else "demo_mcq (Acc.)"
        row = [x for x in table.rows if x.section == section and x.labels[0] == r["backbone"] and x.labels[1] == open_share.metric_label(r["metric"])]
        cell = row[0].cells[f"{r['share']:g}"]
        if math.isnan(r["value"]):
            assert cell.missing
        else:
            assert (cell.value, cell.ci) == (r["value"], (r["ci_low"], r["ci_high"]))
    assert table.notes[0].startswith("demo: share asked -> share of its DEPICT questions left open: 0 -> 0.000, 0.25 -> 0.")


def test_write_open_share_files_and_index(tmp_path, run_dirs):
    out = tmp_path / "fig"
    index = write_open_share([str(d) for d in run_dirs], str(out), ["md", "csv"])
    assert sorted(p.name for p in out.iterdir()) == ["open_share.csv", "open_share.md", "open_share.png", "open_share_data.csv", "open_share_index.json", "open_share_index.md"]
    assert [r["open_share"] for r in index["runs"]] == sorted(SHARES)
    assert json.loads((out / "open_share_index.json").read_text()) == index
    written = pl.read_csv(out / "open_share_data.csv")
    assert written.columns == list(open_share.DATA_SCHEMA) and written.height == index["table"]["data_rows"]
    assert "| 0.25 | 0." in (out / "open_share_index.md").read_text()
