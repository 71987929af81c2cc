"""Report tables and figures from a finished sweep run, without rerunning any model.

- `run`: read a run directory (local or s3://) into a typed `Run`;
- `tables`: each table as plain data (rows, columns, cells with marks);
- `render`: Markdown / LaTeX / CSV of a table;
- `figures`: forest plot of deltas and lambda sensitivity (matplotlib, Agg);
- `write`: everything for one run, plus index.md / index.json; `write_open_share`: the figure of
  several runs that differ only in `questions.open_share` (`open_share`: its numbers, checks).
See docs/reports.md.
"""
from pipeline.reports.finished_run import BackboneInfo, BenchmarkInfo, Run, open_run
from pipeline.reports.write import FORMATS, build_tables, write_open_share, write_reports

__all__ = ["FORMATS", "BackboneInfo", "BenchmarkInfo", "Run", "build_tables", "open_run", "write_open_share", "write_reports"]
