"""The metric catalog is the one list of metric ids: the formulas, the configs in conf/, the
report tables' labels and the docs must name exactly its metrics. Each check returns the
problems it finds, so the tests below also show it failing on a corrupted copy."""
from __future__ import annotations

import math
import re
from pathlib import Path

import polars as pl
import pytest
from omegaconf import OmegaConf

from operators.judge_output import JUDGE_KINDS
from operators.metrics import catalog, score_all
from operators.schema import QUESTION_SETS
from pipeline.config import CONF_DIR, SweepConfig
from pipeline.reports import tables

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "DESIGN.md"
README = ROOT / "README.md"
FAMILIES = ("merge", "depict", "dsg", "holistic", "claims", "grounding", "judge")


def section(text: str, heading: str) -> str:
    """The lines under `heading` up to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    end = re.search(rf"\n#{{1,{len(level)}}} ", text[start:])
    return text[start:start + end.start()] if end else text[start:]


def table_rows(text: str) -> list[list[str]]:
    """Cells of every Markdown table row in `text`, header and rule rows left out."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    return [r for r in rows[2:] if not set("".join(r)) <= set("-: ")] if rows else []


def expand(ids: str) -> list[str]:
    """`claim_mean_{am,gm}` -> claim_mean_am, claim_mean_gm (README's shorthand)."""
    match = re.fullmatch(r"(.*)\{(.*)\}(.*)", ids)
    return [f"{match[1]}{part}{match[3]}" for part in match[2].split(",")] if match else [ids]


def design_problems(text: str) -> list[str]:
    """docs/DESIGN.md's "Metric ids" table against the catalog: the same rows, cells and order."""
    documented = {row[0].strip("`"): row for row in table_rows(section(text, "## Metric ids"))}
    expected = {
        m.id: [f"`{m.id}`", m.family, m.question_set or "-", m.answer_kind, "yes" if m.mergeable else "no", m.label]
        for m in catalog.METRICS
    }
    problems = [f"DESIGN.md's metric table lacks {m}" for m in expected if m not in documented]
    problems += [f"DESIGN.md's metric table names {m}, which the catalog does not have" for m in documented if m not in expected]
    problems += [f"DESIGN.md lists {m} as {row}, the catalog as {expected[m]}" for m, row in documented.items() if m in expected and row != expected[m]]
    if not problems and list(documented) != list(expected):
        problems.append(f"DESIGN.md's metric table is not in catalog order: {list(documented)}")
    return problems


def readme_problems(text: str) -> list[str]:
    """README's "What it computes" table names every catalog row, and nothing else."""
    listed = set()
    for row in table_rows(section(text, "## What it computes")):
        for name in re.findall(r"`([^`]+)`", row[0]):
            if name != "<term>+vqascore":
                listed.update(expand(name))
    rows = set(catalog.ids())
    return [f"README's metric table lacks {m}" for m in sorted(rows - listed)] + [
        f"README's metric table names {m}, which the catalog does not have" for m in sorted(listed - rows)
    ]


def config_metric_names(cfg) -> list[tuple[str, str]]:
    """(key, metric id) for every place a config names a metric."""
    found = [(f"metrics[{i}]", m) for i, m in enumerate(cfg.get("metrics") or [])]
    found += [(f"baselines[{i}]", m) for i, m in enumerate(cfg.get("baselines") or [])]
    found += [(key, cfg[key]) for key in ("target", "metric") if cfg.get(key)]
    select = (cfg.get("evidence") or {}).get("select") or {}
    if select.get("metric"):
        found.append(("evidence.select.metric", select["metric"]))
    return found


def conf_problems(conf_dir: Path) -> list[str]:
    return [
        f"{path.relative_to(conf_dir)}: {key} names unknown metric {metric!r}"
        for folder in ("sweep", "api", "curation")
        for path in sorted((conf_dir / folder).glob("*.yaml"))
        for key, metric in config_metric_names(OmegaConf.to_container(OmegaConf.load(path)))
        if not catalog.is_known(metric)
    ]


# ------------------------------------------------------------------------- the rows


def test_rows_are_well_formed():
    assert len(set(catalog.ids())) == len(catalog.METRICS)
    for m in catalog.METRICS:
        assert m.family in FAMILIES, m
        assert m.question_set is None or m.question_set in QUESTION_SETS, m
        assert m.answer_kind in catalog.ANSWER_KINDS, m
        assert (m.judge_kind is not None) == (m.family == "judge") and (m.judge_kind is None or m.judge_kind in JUDGE_KINDS), m
        assert m.label and m.description, m
        if m.merge_of:
            term = m.merge_of.split("+", 1)[0]
            assert catalog.BY_ID[term].mergeable and m.merge_of == catalog.merged_id(term), m
    assert all(catalog.is_known(m) for m in catalog.DEFAULT_METRICS)
    assert {catalog.DEFAULT_TARGET, *catalog.DEFAULT_BASELINES} <= set(catalog.DEFAULT_METRICS)


def test_lookups_read_the_term_of_a_merge():
    assert catalog.question_set("claim_mean_gm+vqascore") == "claims"
    assert catalog.question_set("depict") == "depict" and catalog.question_set("vqascore") is None
    assert catalog.is_yes_no("dsg+vqascore") and not catalog.is_yes_no("grounding_only+vqascore")
    assert catalog.needs_detections("grounding_only+vqascore") and not catalog.needs_detections("agree")
    assert catalog.judge_kind("judge_decomposed") == "decomposed" and catalog.judge_kind("agree") is None
    assert catalog.reads_holistic("depict") and catalog.reads_holistic("dsg+vqascore") and not catalog.reads_holistic("dsg")
    assert not catalog.is_known("vqascore+vqascore") and not catalog.is_known("judge_holistic+vqascore")
    assert not catalog.is_known("agree+vqascore_raw") and catalog.is_known("agree+vqascore")


def test_the_formulas_compute_every_row_that_reads_answers_or_detections():
    """A row without its formula (or a formula whose id no row has) fails here."""
    log = math.log
    decomposed = pl.DataFrame({
        "item_id": ["a", "a"], "question_set": ["depict", "dsg"], "question_id": ["1", "1"], "parents": [[], ["0"]],
        "logp_yes_v": [log(0.1)] * 2, "logp_no_v": [log(0.9)] * 2, "logp_yes_t": [log(0.05)] * 2, "logp_no_t": [log(0.95)] * 2,
    })
    holistic = pl.DataFrame({"item_id": ["a"], "logp_yes": [log(0.7)], "logp_no": [log(0.3)]})
    claims = pl.DataFrame({"item_id": ["a"], "claim_id": ["1"], "claim_type": ["object"], "logp_yes": [log(0.8)], "logp_no": [log(0.2)]})
    grounding = pl.DataFrame({"item_id": ["a"], "claim_id": ["1"], "groundable": [True], "s": [0.9]})
    scores = score_all(["a"], decomposed=decomposed, holistic=holistic, claims=claims, grounding=grounding)
    assert set(scores["metric"]) == set(catalog.all_ids()) - set(catalog.ids("judge"))


# ------------------------------------------------------- configs, tables, documents


def test_every_metric_a_shipped_config_names_is_in_the_catalog():
    assert conf_problems(CONF_DIR) == []
    s = SweepConfig()
    assert all(catalog.is_known(m) for m in [*s.metrics, s.target, *s.baselines])


def test_a_config_naming_an_unknown_metric_is_caught(tmp_path):
    for folder in ("sweep", "api", "curation"):
        (tmp_path / folder).mkdir()
    (tmp_path / "sweep" / "x.yaml").write_text("metrics: [depict, soft_tifa_median]\nevidence:\n  select:\n    metric: agree_median\n")
    assert conf_problems(tmp_path) == [
        "sweep/x.yaml: metrics[1] names unknown metric 'soft_tifa_median'",
        "sweep/x.yaml: evidence.select.metric names unknown metric 'agree_median'",
    ]


def test_the_tables_label_every_metric_from_the_catalog_and_no_two_alike():
    every = catalog.all_ids()
    labels = {m: tables.metric_label(m) for m in every}
    assert all(label != m for m, label in labels.items()), [m for m, label in labels.items() if label == m]
    assert len(set(labels.values())) == len(every)
    assert labels["soft_tifa_am+vqascore"] == "Soft-TIFA-AM+VQA" and labels["depict"] == "DEPICT"
    fixed = [*tables.MERGE_METRICS, *tables.MERGE_LABELS, tables.WEIGHTED, tables.UNWEIGHTED, tables.COMMITMENT]
    assert all(catalog.is_known(m) for m in fixed), fixed


def test_the_docs_list_exactly_the_catalog():
    assert design_problems(DESIGN.read_text()) == []
    assert readme_problems(README.read_text()) == []


@pytest.mark.parametrize("metric", ["dsg_nodep", "claim_mean_hm", "judge_decomposed"])
def test_a_metric_missing_from_the_docs_is_caught(metric):
    design = "\n".join(line for line in DESIGN.read_text().splitlines() if not line.startswith(f"| `{metric}` |"))
    assert design_problems(design) == [f"DESIGN.md's metric table lacks {metric}"]
    readme = README.read_text()
    readme = {
        "dsg_nodep": readme.replace("`dsg`, `dsg_nodep`", "`dsg`"),
        "claim_mean_hm": readme.replace("claim_mean_{am,gm,hm,min}", "claim_mean_{am,gm,min}"),
        "judge_decomposed": readme.replace("`judge_holistic`, `judge_decomposed`", "`judge_holistic`"),
    }[metric]
    assert readme_problems(readme) == [f"README's metric table lacks {metric}"]


def test_a_documented_row_that_disagrees_with_the_catalog_is_caught():
    text = DESIGN.read_text().replace("| `vqascore` | holistic | - | yes_no | no |", "| `vqascore` | holistic | - | yes_no | yes |")
    assert len(design_problems(text)) == 1 and "`vqascore`" in design_problems(text)[0]


def test_merge_ids_follow_the_mergeable_rows():
    merges = [m for m in catalog.all_ids() if "+" in m]
    assert merges == [f"{t}+vqascore" for t in catalog.MERGE_TERMS]
    assert all(catalog.BY_ID[t].mergeable for t in catalog.MERGE_TERMS)
    assert "mean_commitment" not in catalog.MERGE_TERMS and "agree" in catalog.MERGE_TERMS
    assert catalog.names_of_merge("agree+vqascore") == ["depict"] and catalog.names_of_merge("dsg+vqascore") == []
