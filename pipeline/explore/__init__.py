"""The per-item explorer: a static, offline site for one run (jobs/explore.py, docs/explorer.md)."""
