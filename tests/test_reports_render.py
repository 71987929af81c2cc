"""Markdown, LaTeX and CSV renderings of a hand-made table."""
from __future__ import annotations

import csv
import io

import pytest

from pipeline.reports.render import cell_text, tex_escape, to_csv, to_latex, to_markdown
from pipeline.reports.tables import Cell, Column, Row, Table


def sample() -> Table:
    columns = [
        Column("a:srcc", "SRCC", group="GenAI-Bench"),
        Column("w:text", "Text", group="Wino_ground"),
        Column("w:group", "Group", group="Wino_ground"),
        Column("share", "NO share, %", digits=1, scale=100, show_ci=True),
        Column("delta", "Δ", signed=True),
        Column("baseline", "vs."),
    ]
    rows = [
        Row(["qwen3_5-27b"], {
            "a:srcc": Cell(0.72, bold=True), "w:text": Cell(0.8225, underline=True), "w:group": Cell(),
            "share": Cell(0.0304, ci=(0.026, 0.035)), "delta": Cell(0.022, ci=(0.01, 0.034), star=True), "baseline": Cell(text="VQAScore"),
        }, section="First block"),
        Row(["qwen3_5-4b"], {
            "a:srcc": Cell(-0.0004), "w:text": Cell(), "w:group": Cell(0.5), "share": Cell(),
            "delta": Cell(-0.0151, ci=(-0.03, 0.001)), "baseline": Cell(text="DSG|x"),
        }, section="Second block"),
    ]  # fmt: skip
    return Table("sample", "A sample table", "How to read it: 95% intervals.", ["Backbone"], columns, rows, ["qwen3_5-27b", "qwen3_5-4b"], ["a", "w"], notes=["one note"])


def test_cell_text_scales_rounds_and_signs():
    assert cell_text(Cell(0.0304, ci=(0.026, 0.035)), Column("x", "x", digits=1, scale=100, show_ci=True)) == "3.0 [2.6, 3.5]"
    assert cell_text(Cell(0.0304, ci=(0.026, 0.035)), Column("x", "x", digits=1, scale=100)) == "3.0"
    assert cell_text(Cell(-0.0004), Column("x", "x", signed=True)) == "+0.000"  # no "-0.000"
    assert cell_text(Cell(-0.0004), Column("x", "x")) == "0.000"
    assert cell_text(Cell(0.0151), Column("x", "x", signed=True)) == "+0.015"
    assert cell_text(Cell(12.0), Column("x", "x", digits=0)) == "12"


def test_markdown():
    text = to_markdown(sample(), run="r1")
    lines = text.splitlines()
    assert lines[0] == "## A sample table"
    assert "Run: r1. Backbones: qwen3_5-27b, qwen3_5-4b. Benchmarks: a, w." in lines
    header = lines.index("| Backbone | GenAI-Bench SRCC | Wino\\_ground Text | Wino\\_ground Group | NO share, % | Δ | vs. |")
    assert lines[header + 1] == "|:--|--:|--:|--:|--:|--:|:--|"
    assert lines[header + 2] == "| *First block* |  |  |  |  |  |  |"
    assert lines[header + 3] == "| qwen3\\_5-27b | **0.720** | <ins>0.823</ins> | — | 3.0 [2.6, 3.5] | +0.022\\* | VQAScore |"
    assert lines[header + 5] == "| qwen3\\_5-4b | 0.000 | — | 0.500 | — | -0.015 | DSG\\|x |"
    assert lines[-1] == "- one note"


def test_latex_uses_booktabs_and_marks():
    text = to_latex(sample())
    lines = text.splitlines()
    for rule in (r"\toprule", r"\midrule", r"\bottomrule"):
        assert rule in lines
    assert r"\begin{tabular}{lrrrrrl}" in lines  # text column left-aligned
    assert r" & \multicolumn{1}{c}{GenAI-Bench} & \multicolumn{2}{c}{Wino\_ground} &  &  &  \\" in lines
    assert r"\cmidrule(lr){2-2} \cmidrule(lr){3-4}" in lines
    assert r"Backbone & SRCC & Text & Group & NO share, \% & $\Delta$ & vs. \\" in lines
    assert r"\multicolumn{7}{l}{\textit{First block}} \\" in lines
    assert r"qwen3\_5-27b & \textbf{0.720} & \underline{0.823} & -- & 3.0 [2.6, 3.5] & $+$0.022$^{*}$ & VQAScore \\" in lines
    assert r"qwen3\_5-4b & 0.000 & -- & 0.500 & -- & $-$0.015 & DSG$|$x \\" in lines
    second = lines.index(r"\multicolumn{7}{l}{\textit{Second block}} \\")
    assert lines[second - 1] == r"\midrule"
    assert r"\caption{How to read it: 95\% intervals.}" in lines and r"\label{tab:sample}" in lines


def test_tex_escape():
    assert tex_escape("a_b & 5% #1 {x} ~ ^ \\") == r"a\_b \& 5\% \#1 \{x\} \textasciitilde{} \textasciicircum{} \textbackslash{}"
    assert tex_escape("λ·x − y") == r"$\lambda$$\cdot$x $-$ y"


def test_csv_has_full_precision_intervals_and_empty_missing_cells():
    rows = list(csv.reader(io.StringIO(to_csv(sample()))))
    assert rows[0] == [
        "section", "Backbone", "GenAI-Bench SRCC", "Wino_ground Text", "Wino_ground Group",
        "NO share, %", "NO share, % ci_low", "NO share, % ci_high",
        "Δ", "Δ ci_low", "Δ ci_high", "Δ significant", "vs.",
    ]  # fmt: skip
    assert rows[1] == ["First block", "qwen3_5-27b", "0.72", "0.8225", "", "3.04", "2.6", "3.5", "0.022", "0.01", "0.034", "true", "VQAScore"]
    assert rows[2] == ["Second block", "qwen3_5-4b", "-0.0004", "", "0.5", "", "", "", "-0.0151", "-0.03", "0.001", "false", "DSG|x"]
    assert len(rows) == 3


def test_csv_without_sections_or_intervals_has_no_extra_columns():
    table = Table("t", "t", "c", ["Metric"], [Column("v", "Value")], [Row(["DSG"], {"v": Cell(0.5)}), Row(["VQA"], {})], [], [])
    assert to_csv(table) == "Metric,Value\nDSG,0.5\nVQA,\n"
    assert "| VQA | — |" in to_markdown(table)
    assert r"VQA & -- \\" in to_latex(table)


def test_csv_significance_is_unknown_without_an_interval():
    column = Column("d", "Δ", signed=True)
    rows = [Row(["a"], {"d": Cell(0.1, ci=(0.05, 0.2), star=True)}), Row(["b"], {"d": Cell(-0.1)}), Row(["c"], {"d": Cell(0.1, ci=(-0.1, 0.3))})]
    table = Table("t", "t", "c", ["Backbone"], [column], rows, [], [])
    assert to_csv(table).splitlines()[1:] == ["a,0.1,0.05,0.2,true", "b,-0.1,,,", "c,0.1,-0.1,0.3,false"]


@pytest.mark.parametrize("render", [to_markdown, to_latex, to_csv])
def test_renderers_show_the_same_cells(render):
    """Every number of the table appears in every format (rounded where displayed)."""
    text = render(sample())
    for shown in ("0.72", "0.5", "VQAScore"):
        assert shown in text
