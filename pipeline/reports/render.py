"""Markdown, LaTeX and CSV renderings of a `tables.Table`.

All three show the same numbers; they differ only in syntax:
- Markdown (GitHub): best **bold**, second <ins>underlined</ins> (GitHub keeps `<ins>`,
  not `<u>`), a star `\\*` after a significant delta, missing cells "—".
- LaTeX (booktabs: \\toprule / \\midrule / \\bottomrule): \\textbf best, \\underline second,
  `$^{*}$` star, missing cells "--"; spanning benchmark headers with \\cmidrule.
- CSV: one line per row, numbers at full precision in the displayed unit (x100 where the
  column says %), an interval as `<column> ci_low` / `<column> ci_high`, a delta's
  significance as `<column> significant`; missing cells are empty. Marks are not written
  (they follow from the numbers).
"""
from __future__ import annotations

import csv
import io

from pipeline.reports.tables import Cell, Column, Table

MISSING = {"md": "—", "tex": "--", "csv": ""}


def _number(value: float, column: Column) -> str:
    shown = column.shown(value)
    return f"{shown:+.{column.digits}f}" if column.signed else f"{shown:.{column.digits}f}"


def cell_text(cell: Cell, column: Column) -> str:
    """The cell's value as displayed, without marks (value, then "[low, high]" if shown)."""
    if cell.text is not None:
        return cell.text
    text = _number(cell.value, column)
    if column.show_ci and cell.ci is not None:
        low, high = (f"{column.shown(v):.{column.digits}f}" for v in cell.ci)
        text += f" [{low}, {high}]"
    return text


def _is_text_column(table: Table, column: Column) -> bool:
    cells = [r.cells.get(column.key, Cell()) for r in table.rows]
    filled = [c for c in cells if not c.missing]
    return bool(filled) and all(c.text is not None for c in filled)


def _has_sections(table: Table) -> bool:
    return any(r.section for r in table.rows)


# ---------------------------------------------------------------------------------------------
# Markdown


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("*", "\\*").replace("_", "\\_")


def _md_cell(cell: Cell, column: Column) -> str:
    if cell.missing:
        return MISSING["md"]
    text = _md_escape(cell_text(cell, column))
    if cell.star:
        text += "\\*"
    if cell.bold:
        text = f"**{text}**"
    elif cell.underline:
        text = f"<ins>{text}</ins>"
    return text


def to_markdown(table: Table, *, run: str = "") -> str:
    width = len(table.stub) + len(table.columns)
    header = [*table.stub, *(c.header for c in table.columns)]
    align = [":--"] * len(table.stub) + [":--" if _is_text_column(table, c) else "--:" for c in table.columns]
    lines = [f"## {_md_escape(table.title)}", "", _md_escape(table.caption), ""]
    covers = f"Backbones: {', '.join(table.backbones) or 'none'}. Benchmarks: {', '.join(table.benchmarks) or 'none'}."
    lines += [(f"Run: {run}. " if run else "") + covers, ""]
    lines.append("| " + " | ".join(_md_escape(h) for h in header) + " |")
    lines.append("|" + "|".join(align) + "|")
    section = None
    for row in table.rows:
        if _has_sections(table) and row.section != section:
            section = row.section
            lines.append("| " + " | ".join([f"*{_md_escape(section)}*"] + [""] * (width - 1)) + " |")
        cells = [_md_escape(label) for label in row.labels]
        cells += [_md_cell(row.cells.get(c.key, Cell()), c) for c in table.columns]
        lines.append("| " + " | ".join(cells) + " |")
    if table.notes:
        lines += ["", *(f"- {_md_escape(note)}" for note in table.notes)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# LaTeX

_TEX_SPECIAL = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "Δ": r"$\Delta$", "λ": r"$\lambda$", "·": r"$\cdot$", "−": r"$-$", "—": "--", "×": r"$\times$",
    "<": r"$<$", ">": r"$>$", "|": r"$|$",
}  # fmt: skip


def tex_escape(text: str) -> str:
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in text)


def _tex_cell(cell: Cell, column: Column) -> str:
    if cell.missing:
        return MISSING["tex"]
    text = tex_escape(cell_text(cell, column))
    if cell.text is None:
        text = text.replace("-", "$-$").replace("+", "$+$") if column.signed else text.replace("-", "$-$")
    if cell.bold:
        text = rf"\textbf{{{text}}}"
    elif cell.underline:
        text = rf"\underline{{{text}}}"
    if cell.star:
        text += r"$^{*}$"
    return text


def _tex_group_header(table: Table) -> list[str]:
    """The spanning header line and its \\cmidrule(s), or nothing if no column has a group."""
    if not any(c.group for c in table.columns):
        return []
    spans: list[tuple[str, int, int]] = []  # (group, first column number, last), 1-based
    for i, column in enumerate(table.columns, start=len(table.stub) + 1):
        if spans and spans[-1][0] == column.group and column.group:
            spans[-1] = (column.group, spans[-1][1], i)
        else:
            spans.append((column.group, i, i))
    cells = [""] * len(table.stub)
    rules = []
    for group, first, last in spans:
        if group:
            cells.append(rf"\multicolumn{{{last - first + 1}}}{{c}}{{{tex_escape(group)}}}")
            rules.append(rf"\cmidrule(lr){{{first}-{last}}}")
        else:
            cells += [""] * (last - first + 1)
    return [" & ".join(cells) + r" \\", " ".join(rules)]


def to_latex(table: Table, *, run: str = "") -> str:
    width = len(table.stub) + len(table.columns)
    spec = "l" * len(table.stub) + "".join("l" if _is_text_column(table, c) else "r" for c in table.columns)
    lines = [
        f"% {tex_escape(table.title)}" + (f" -- run {tex_escape(run)}" if run else ""),
        "% needs \\usepackage{booktabs}",
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        *_tex_group_header(table),
        " & ".join(tex_escape(h) for h in [*table.stub, *(c.label if c.group else c.header for c in table.columns)]) + r" \\",
        r"\midrule",
    ]
    section = None
    for index, row in enumerate(table.rows):
        if _has_sections(table) and row.section != section:
            section = row.section
            if index:
                lines.append(r"\midrule")
            lines.append(rf"\multicolumn{{{width}}}{{l}}{{\textit{{{tex_escape(section)}}}}} \\")
        cells = [tex_escape(label) for label in row.labels]
        cells += [_tex_cell(row.cells.get(c.key, Cell()), c) for c in table.columns]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{tex_escape(table.caption)}}}", rf"\label{{tab:{table.name}}}", r"\end{table}"]
    lines += [f"% note: {tex_escape(note)}" for note in table.notes]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# CSV


def _csv_number(value: float | None, column: Column) -> str:
    return "" if value is None else f"{value * column.scale:.12g}"


def to_csv(table: Table, *, run: str = "") -> str:
    sections = _has_sections(table)
    with_ci = {c.key for c in table.columns if any(r.cells.get(c.key, Cell()).ci for r in table.rows)}
    with_significance = {c.key for c in table.columns if c.signed and c.key in with_ci}
    header = (["section"] if sections else []) + list(table.stub)
    for column in table.columns:
        header.append(column.header)
        if column.key in with_ci:
            header += [f"{column.header} ci_low", f"{column.header} ci_high"]
        if column.key in with_significance:
            header.append(f"{column.header} significant")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for row in table.rows:
        line = ([row.section] if sections else []) + list(row.labels)
        for column in table.columns:
            cell = row.cells.get(column.key, Cell())
            line.append(cell.text if cell.text is not None else _csv_number(cell.value, column))
            if column.key in with_ci:
                low, high = cell.ci or (None, None)
                line += [_csv_number(low, column), _csv_number(high, column)]
            if column.key in with_significance:
                line.append("" if cell.ci is None else str(cell.star).lower())
        writer.writerow(line)
    return out.getvalue()


RENDERERS = {"md": to_markdown, "tex": to_latex, "csv": to_csv}
