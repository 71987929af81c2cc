"""`jobs/score.py pairs=FILE`: CSV / JSONL / Parquet in, scores and records next to it, a
rerun served from the cache, bad rows as error rows and a bad file as a clear message."""
from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import polars as pl
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cli():
    spec = importlib.util.spec_from_file_location("score_job", REPO / "jobs" / "score.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    (root / "imgs").mkdir()
    Image.new("RGB", (40, 32), "red").save(root / "imgs" / "red.png")
    Image.new("RGB", (40, 32), "blue").save(root / "imgs" / "blue.png")
    (root / "questions.csv").write_text("caption,question\na red box,Is there a box?\na red box,Is the box red?\na blue box,Is the box blue?\n")
    return root


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def test_csv_pairs_are_scored_next_to_the_file_and_a_rerun_sends_nothing(cli, folder, tiny_vlm_dir, capsys):
    pairs = folder / "mine.csv"
    pairs.write_text("path,text,id\nimgs/red.png,a red box,k1\nimgs/blue.png,a blue box,k2\nimgs/gone.png,a red box,k3\nimgs/red.png,,k4\n")
    args = [f"pairs={pairs}", "image=path", "caption=text", f"questions={folder / 'questions.csv'}", f"root={folder / 'cache'}", "metrics=[depict,vqascore]"]
    assert cli.main(args) == 0
    out = folder / "mine.depict"
    scores = pl.read_parquet(out / "pair_scores.parquet")
    assert scores["id"].to_list() == ["k1", "k2", "k3", "k4"]  # the file's own columns, in file order
    assert scores["path"][0] == str(folder / "imgs" / "red.png")  # relative to the file's folder
    assert scores["error"].to_list() == [None, None, "unreadable_image", "empty_caption"]
    assert scores["depict"].null_count() == 2
    records = pl.read_parquet(out / "pair_records.parquet")
    assert sorted(set(records["row"])) == [0, 1] and {"p_v", "p_t", "commitment", "agreement"} <= set(records.columns)
    assert pl.read_csv(out / "pair_scores.csv").height == 4
    printed = capsys.readouterr().out
    assert "errors: empty_caption: 1, unreadable_image: 1" in printed and "depict" in printed
    first = _manifest(out)
    assert sum(s["sent"] for s in first["stages"] if s["stage"] == "answers") > 0

    assert cli.main(args) == 0  # the rerun: every answer from the cache
    again = _manifest(out)
    assert [s["sent"] for s in again["stages"] if s["stage"] == "answers"] == [0]
    assert pl.read_parquet(out / "pair_scores.parquet").equals(scores)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_jsonl_and_parquet_with_image_bytes(cli, folder, tiny_vlm_dir, fmt, tmp_path):
    rows = [{"image": str(folder / "imgs" / "blue.png"), "caption": "a blue box"}]
    if fmt == "jsonl":
        path = tmp_path / "p.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    else:
        buffer = io.BytesIO()
        Image.new("RGB", (40, 32), "red").save(buffer, format="PNG")
        path = tmp_path / "p.parquet"
        pl.DataFrame({"image": [buffer.getvalue()], "caption": ["a red box"]}).write_parquet(path)
    out = tmp_path / "out"
    assert cli.main([f"pairs={path}", f"out={out}", f"questions={folder / 'questions.csv'}", f"root={folder / 'cache'}"]) == 0
    scores = pl.read_parquet(out / "pair_scores.parquet")
    assert scores.height == 1 and scores["error"][0] is None and scores["depict"][0] is not None


def test_a_bad_file_or_column_is_a_clear_message(cli, tmp_path, capsys):
    assert cli.main([f"pairs={tmp_path / 'none.csv'}"]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "cols.csv"
    bad.write_text("img,caption\na.png,x\n")
    assert cli.main([f"pairs={bad}"]) == 2
    err = capsys.readouterr().err
    assert "no column 'image'" in err and "image=<column>" in err
    assert cli.main(["metrics=[depict]"]) == 2
    assert "pairs=FILE" in capsys.readouterr().err
