"""Write every table and figure of a run, plus an index of what was written.

`write_reports(run_url)` reads the run once, builds whatever tables and figures its
backbones and benchmarks allow, renders each table in the requested formats and writes
them under `out` (default `<run>/tables/`, local or s3://). `index.json` and `index.md`
list every file, what each table covers (run, backbones, benchmarks) and, for every table
that could not be built, why (e.g. no skill tags in the run) - nothing is left out silently.

`write_open_share(run_urls, out)` reads several runs that differ only in
`questions.open_share` and writes the figure of each metric against that share
(`open_share.py`), its table, its numbers one per line and an index of its own.
"""
from __future__ import annotations

import io
import json
import time
from collections.abc import Sequence

from pipeline.reports import figures, open_share, tables
from pipeline.reports.finished_run import Run, open_run
from pipeline.reports.render import RENDERERS
from pipeline.store.fs import write_bytes_atomic

FORMATS = ("md", "tex", "csv")


def build_tables(run: Run, *, n_resamples: int | None = None) -> tuple[list[tables.Table], list[figures.Plot], list[dict]]:
    """(tables, figures, skipped) for everything the run holds, in the paper's order."""
    built: list[tables.Table] = []
    skipped: list[dict] = []

    def add(result, what: str, paper: str, reason: str) -> None:
        found = [t for t in (result if isinstance(result, list) else [result]) if t is not None]
        built.extend(found)
        if not found:
            skipped.append({"what": what, "paper": paper, "reason": reason})

    add(tables.comparison_tables(run), "comparison", "Table 2", "the run holds no backbone")
    add(tables.size_ladder_table(run), "size_ladder", "Tables 7 and 8", "no statistics in the run")
    add(tables.template_tables(run), "templates", "Table 9", "no benchmark has template subsets (protocol.breakdowns: [template])")
    add(tables.skill_tables(run), "skills", "Table 10", "no benchmark has skill-tag subsets (protocol.breakdowns: [tags])")
    add(
        tables.commitment_gain_table(run, n_resamples=n_resamples), "commitment_gain", "Table 12",
        f"needs {tables.WEIGHTED}, {tables.UNWEIGHTED} and {tables.COMMITMENT} scores on some benchmark",
    )  # fmt: skip
    add(tables.merge_tables(run), "merge", "Table 13", "the run holds no backbone")
    add(tables.answer_distribution_table(run, n_resamples=n_resamples), "answer_distribution", "Table 15", "the run stored no per-question records")

    sensitivity = {backbone: tables.lambda_sensitivity(run, backbone) for backbone in run.backbones}
    add(tables.lambda_tables(run, sensitivity), "lambda", "Figure 9 (data)", "needs agree and vqascore scores")

    plots: list[figures.Plot] = []
    forest = figures.forest_plot(run)
    if forest is None:
        skipped.append({"what": "forest_deltas", "paper": "Figure 8", "reason": "the run has no deltas (target or baselines not scored)"})
    else:
        plots.append(forest)
    for backbone, data in sensitivity.items():
        plot = figures.lambda_plot(run, backbone, data)
        if plot is None:
            skipped.append({"what": f"lambda_{backbone}", "paper": "Figure 9", "reason": f"{backbone}: needs agree and vqascore scores"})
        else:
            plots.append(plot)
    return built, plots, skipped


def write_reports(
    run_url: str,
    out: str | None = None,
    formats: Sequence[str] = FORMATS,
    *,
    n_resamples: int | None = None,
) -> dict:
    """Write all tables (in `formats`) and figures of the run at `run_url`; return the index.

    `n_resamples` overrides the run's bootstrap size for the intervals computed here
    (commitment gain, answer distributions); the other intervals come from the run.
    """
    unknown = [f for f in formats if f not in RENDERERS]
    if unknown or not formats:
        raise ValueError(f"formats must be a non-empty subset of {list(RENDERERS)}, got {list(formats)}")
    run = open_run(run_url)
    out = (out or f"{run.url}/tables").rstrip("/")
    built, plots, skipped = build_tables(run, n_resamples=n_resamples)

    table_entries = []
    for table in built:
        files = {}
        for fmt in formats:
            files[fmt] = f"{table.name}.{fmt}"
            write_bytes_atomic(f"{out}/{files[fmt]}", RENDERERS[fmt](table, run=run.name).encode())
        table_entries.append(
            {
                "name": table.name, "title": table.title, "paper": table.paper, "files": files,
                "run": run.url, "backbones": table.backbones, "benchmarks": table.benchmarks,
                "rows": len(table.rows), "notes": table.notes,
            }
        )  # fmt: skip
    figure_entries = []
    for plot in plots:
        file = f"{plot.name}.png"
        write_bytes_atomic(f"{out}/{file}", plot.png())
        figure_entries.append(
            {"name": plot.name, "title": plot.title, "paper": plot.paper, "file": file, "run": run.url, "backbones": plot.backbones, "benchmarks": plot.benchmarks}
        )
    index = {
        "run": run.url,
        "run_name": run.name,
        "out": out,
        "formats": list(formats),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "backbones": list(run.backbones),
        "benchmarks": list(run.benchmarks),
        "tables": table_entries,
        "figures": figure_entries,
        "skipped": skipped,
        "problems": run.problems,
        "run_errors": run.errors.height,
    }
    write_bytes_atomic(f"{out}/index.json", json.dumps(index, indent=2).encode())
    write_bytes_atomic(f"{out}/index.md", index_markdown(index).encode())
    return index


def index_markdown(index: dict) -> str:
    """The index as a readable page: tables with their files and coverage, figures, gaps."""
    lines = [
        f"# Reports for run {index['run_name']}",
        "",
        f"Run: `{index['run']}`  ",
        f"Backbones: {', '.join(index['backbones']) or 'none'}  ",
        f"Benchmarks: {', '.join(index['benchmarks']) or 'none'}  ",
        f"Errors recorded by the run: {index['run_errors']}",
        "",
        "## Tables",
        "",
        "| paper | table | files | backbones | benchmarks |",
        "|:--|:--|:--|:--|:--|",
    ]
    for t in index["tables"]:
        files = " ".join(f"[{fmt}]({path})" for fmt, path in t["files"].items())
        lines.append(f"| {t['paper']} | {t['title']} | {files} | {', '.join(t['backbones'])} | {', '.join(t['benchmarks'])} |")
    lines += ["", "## Figures", ""]
    for f in index["figures"]:
        lines += [f"### {f['paper']}: {f['title']}", "", f"Backbones: {', '.join(f['backbones'])}. Benchmarks: {', '.join(f['benchmarks'])}.", "", f"![{f['title']}]({f['file']})", ""]
    if index["skipped"]:
        lines += ["## Not produced", ""]
        lines += [f"- {s['paper']} ({s['what']}): {s['reason']}" for s in index["skipped"]]
        lines.append("")
    if index["problems"]:
        lines += ["## Problems reading the run", ""]
        lines += [f"- {p}" for p in index["problems"]]
        lines.append("")
    return "\n".join(lines)


OPEN_SHARE_INDEX = "open_share_index"  # not index.*: `out` may be a run's own tables folder


def write_open_share(run_urls: Sequence[str], out: str, formats: Sequence[str] = FORMATS, *, metrics: Sequence[str] | None = None) -> dict:
    """Write the open-share figure of the runs at `run_urls` under `out`; return its index.

    Files: `open_share.png`, the table `open_share.<fmt>`, `open_share_data.csv` (one line per
    share, benchmark, backbone and metric, with the realised share) and `open_share_index.json`
    / `.md`. Raises `open_share.RunsDiffer` for runs that differ in more than the share.
    """
    unknown = [f for f in formats if f not in RENDERERS]
    if unknown or not formats:
        raise ValueError(f"formats must be a non-empty subset of {list(RENDERERS)}, got {list(formats)}")
    runs = [open_run(url) for url in run_urls]
    open_share.check_comparable(runs)
    drawn = open_share.figure_metrics(runs[0], metrics)
    data, notes = open_share.open_share_data(runs)
    table = open_share.open_share_table(data, notes)
    out = out.rstrip("/")
    files = {}
    names = ", ".join(run.name for run in sorted(runs, key=open_share.open_share))
    for fmt in formats:
        files[fmt] = f"{table.name}.{fmt}"
        write_bytes_atomic(f"{out}/{files[fmt]}", RENDERERS[fmt](table, run=names).encode())
    buffer = io.BytesIO()
    data.write_csv(buffer)
    files["data"] = "open_share_data.csv"
    write_bytes_atomic(f"{out}/{files['data']}", buffer.getvalue())
    plot = figures.open_share_plot(data, drawn, runs=f"runs {names}")
    figure = None
    if plot is not None:
        figure = f"{plot.name}.png"
        write_bytes_atomic(f"{out}/{figure}", plot.png())
    realised = {}
    for row in data.select("run", "benchmark", "realised_share").unique(maintain_order=True).iter_rows(named=True):
        realised.setdefault(row["run"], {})[row["benchmark"]] = row["realised_share"]
    index = {
        "out": out,
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": [
            {"run": run.url, "run_name": run.name, "open_share": open_share.open_share(run), "realised_share": realised.get(run.url, {}),
             "problems": run.problems, "run_errors": run.errors.height}
            for run in sorted(runs, key=open_share.open_share)
        ],  # fmt: skip
        "backbones": table.backbones,
        "benchmarks": table.benchmarks,
        "figure_metrics": drawn,
        "table": {"name": table.name, "title": table.title, "files": files, "rows": len(table.rows), "data_rows": data.height},
        "figure": figure,
        "notes": table.notes,
    }
    write_bytes_atomic(f"{out}/{OPEN_SHARE_INDEX}.json", json.dumps(index, indent=2).encode())
    write_bytes_atomic(f"{out}/{OPEN_SHARE_INDEX}.md", open_share_markdown(index).encode())
    return index


def open_share_markdown(index: dict) -> str:
    """The open-share index as a page: the runs with their shares, the files, the figure, notes."""
    benchmarks = index["benchmarks"]
    lines = [
        "# Metrics against the share of open questions",
        "",
        f"Backbones: {', '.join(index['backbones']) or 'none'}  ",
        f"Benchmarks: {', '.join(benchmarks) or 'none'}  ",
        f"Metrics drawn: {', '.join(index['figure_metrics'])}",
        "",
        "| share asked | " + " | ".join(f"{b} realised" for b in benchmarks) + " | run | errors |",
        "|--:|" + "--:|" * len(benchmarks) + ":--|--:|",
    ]
    for run in index["runs"]:
        shown = [("—" if run["realised_share"].get(b) is None else f"{run['realised_share'][b]:.3f}") for b in benchmarks]
        lines.append(f"| {run['open_share']:g} | " + " | ".join(shown) + f" | `{run['run']}` | {run['run_errors']} |")
    files = " ".join(f"[{fmt}]({path})" for fmt, path in index["table"]["files"].items())
    lines += ["", f"Table: {files}", ""]
    if index["figure"]:
        lines += [f"![Metrics against the share of open questions]({index['figure']})", ""]
    problems = [p for run in index["runs"] for p in run["problems"]]
    if index["notes"] or problems:
        lines += ["## Notes", "", *(f"- {n}" for n in [*index["notes"], *problems]), ""]
    return "\n".join(lines)
