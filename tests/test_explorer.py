"""The explorer (jobs/explore.py): the site's data from a run folder, and the page itself in
a real headless Chromium loaded from disk (file://, no network): items, sorting, filtering,
an item's questions and bars, evidence boxes, and no console errors."""
from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from PIL import Image

from operators import schema
from operators.hashing import image_hash
from pipeline.stages.evidence import DELTAS_TABLE, GROUNDING_TABLE, VIEWS_TABLE

REPO = Path(__file__).resolve().parent.parent
N = 60  # more than one page (50 rows)
COLORS = ["red", "blue", "green", "orange", "purple", "gray"]


def _png(path: Path, color: str, size=(64, 48)) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return image_hash(path.read_bytes())


def depict_of(i: int) -> float:
    return ((i * 37) % N) / N  # a permutation of 0..59 / 60: every score distinct


def _conform(rows: list[dict], target: pa.Schema) -> pa.Table:
    return schema.conform(pa.Table.from_pylist(rows), target)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A small run folder with every table the explorer reads, with known values."""
    root = tmp_path_factory.mktemp("explore")
    run, store = root / "runs" / "synthetic", root / "store"
    images = {c: (str(root / "data" / f"{c}.png"), _png(root / "data" / f"{c}.png", c)) for c in COLORS}
    items, scores, records = [], [], []
    for i in range(N):
        uri, h = images[COLORS[i % len(COLORS)]]
        iid = f"bench/i{i:02d}"
        items.append({"item_id": iid, "benchmark": "bench", "image_uri": uri, "image_hash": h, "caption": f"caption {i} {'two dogs' if i % 2 else 'a cat'}",
                      "group_id": iid, "human": float(i % 7), "tags": ["count"] if i % 3 == 0 else ["spatial"], "template": "neg" if i % 4 == 0 else "aff"})
        for metric, value in (("depict", depict_of(i)), ("vqascore", 1 - depict_of(i))):
            scores.append({"item_id": iid, "benchmark": "bench", "backbone": "smoke", "metric": metric, "score": value, "note": None})
        for q in range(3):
            p_v, p_t = (q + 1) / 4, 0.9 if q != 2 else 0.1
            records.append({"item_id": iid, "caption": items[-1]["caption"], "image_hash": h, "question_set": "depict", "question_id": str(q + 1),
                            "question": f"Is there thing {q + 1}?", "parents": [], "claim_type": None,
                            "logp_yes_v": math.log(p_v), "logp_no_v": math.log(1 - p_v), "logp_yes_t": math.log(p_t), "logp_no_t": math.log(1 - p_t), "backbone": "smoke"})
        records.append({"item_id": iid, "caption": items[-1]["caption"], "image_hash": h, "question_set": "dsg", "question_id": "2", "question": "Is it big?",
                        "parents": ["1"], "claim_type": None, "logp_yes_v": math.log(0.5), "logp_no_v": math.log(0.5), "logp_yes_t": None, "logp_no_t": None, "backbone": "smoke"})
    scores[1]["score"] = None  # item 0's vqascore failed: a null with a reason, shown as such
    scores[1]["note"] = "answer_failed"
    (run / "scores").mkdir(parents=True)
    (run / "records").mkdir()
    pl.from_arrow(_conform(items, schema.ITEMS)).write_parquet(run / "items.parquet")
    pl.DataFrame(scores, schema={"item_id": pl.String, "benchmark": pl.String, "backbone": pl.String, "metric": pl.String, "score": pl.Float64, "note": pl.String}).write_parquet(run / "scores" / "smoke.parquet")
    pl.DataFrame(records).write_parquet(run / "records" / "smoke.parquet")
    # evidence for item 0: one grounded claim with a box, its views and deltas
    h0 = images["red"][1]
    view_hashes = {v: _png(store / "tmp" / f"{v}.png", "white") if v != "full" else h0 for v in ("full", "minus_evidence")}
    for v, h in view_hashes.items():
        if v != "full":
            target = store / "images" / h[:2] / f"{h}.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(store / "tmp" / f"{v}.png", target)
    key = {"item_id": "bench/i00", "question_set": "claims", "claim_id": "1", "claim": "There is a cat."}
    (run / "evidence" / "smoke").mkdir(parents=True)
    pl.from_arrow(_conform([key | {"image_hash": h0, "claim_type": "object", "rule": "object", "groundable": True, "s": 0.8, "evidence_boxes": [[4.0, 4.0, 30.0, 20.0]], "width": 64, "height": 48}], GROUNDING_TABLE)).write_parquet(run / "evidence" / "smoke" / "grounding.parquet")
    pl.from_arrow(_conform([key | {"image_hash": h0, "eligible": True, "evidence_boxes": [[4, 4, 30, 20]], "control_boxes": [[34, 24, 60, 40]], "fill": "blur", **{f"hash_{v}": h for v, h in view_hashes.items()}}], VIEWS_TABLE)).write_parquet(run / "evidence" / "smoke" / "views.parquet")
    pl.from_arrow(_conform([key | {"claim_type": "object", "eligible": True, "s_full": 1.5, "s_minus_evidence": -0.5, "d_sel": 2.0}], DELTAS_TABLE)).write_parquet(run / "evidence" / "smoke" / "deltas.parquet")
    (run / "judge").mkdir()
    pl.DataFrame([{"item_id": "bench/i00", "benchmark": "bench", "backbone": "smoke", "kind": "holistic", "key": "k", "valid": False, "score": None,
                   "reason": "invalid_judge_output: bad_json", "judgement": None, "raw_text": "{not json"}]).write_parquet(run / "judge" / "smoke.parquet")
    errors = [{"stage": "judge", "benchmark": "bench", "item_id": "bench/i05", "reason": "invalid_judge_output", "detail": "bad_json: Expecting value"},
              {"stage": "metaeval", "benchmark": "bench", "reason": "metaeval_problem", "detail": "too few groups"}]
    pl.from_arrow(_conform(errors, schema.ERRORS)).write_parquet(run / "errors.parquet")
    (run / "manifest.json").write_text(json.dumps({"config": {"sweep": {"run_name": "synthetic", "store": str(store), "metrics": ["depict", "vqascore"], "probability": "normalized"}}}))
    return run


@pytest.fixture(scope="module")
def site(run_dir) -> Path:
    spec = importlib.util.spec_from_file_location("explore_job", REPO / "jobs" / "explore.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = run_dir.parent / "site"
    assert module.main([f"run={run_dir}", f"out={out}"]) == 0
    return out


def _data(site: Path, path: str):
    text = (site / path).read_text()
    match = re.fullmatch(r'DEPICT\.data\("([^"]+)", (.*)\);\n', text, re.S)
    assert match and match.group(1) == path
    return json.loads(match.group(2))


# -------------------------------------------------------------------------- the site's files


def test_site_files_lists_and_details(site):
    index = _data(site, "data/index.js")
    assert [v["view"] for v in index["views"]] == ["bench__smoke"]
    assert {(e["stage"], e["reason"]) for e in index["errors"]} == {("judge", "invalid_judge_output"), ("metaeval", "metaeval_problem")}
    listing = _data(site, "data/bench__smoke.js")
    assert listing["metrics"] == ["depict", "vqascore"] and listing["human"] == "human"
    assert len(listing["items"]["id"]) == N and listing["items"]["errors"][5] == 1
    assert listing["tags"] == ["count", "spatial"] and listing["templates"] == ["aff", "neg"]
    thumb = listing["items"]["thumb"][0]
    with Image.open(site / thumb) as img:
        assert max(img.size) <= 128  # thumbnails, not the full images
    detail = _data(site, "data/bench__smoke/0.js")["bench/i00"]
    depict = [q for q in detail["questions"] if q["question_set"] == "depict"]
    assert [round(q["p_v"], 6) for q in depict] == [0.25, 0.5, 0.75]
    assert [round(q["commitment"], 6) for q in depict] == [0.8, 0.8, 0.8]
    assert round(depict[0]["agreement"], 6) == round(0.25 * 0.9 + 0.75 * 0.1, 6)
    dsg = [q for q in detail["questions"] if q["question_set"] == "dsg"]
    assert dsg[0]["parents"] == ["1"] and dsg[0]["p_t"] is None
    (claim,) = detail["claims"]
    assert claim["boxes"] == [[4.0, 4.0, 30.0, 20.0]] and claim["control_boxes"] == [[34, 24, 60, 40]]
    assert set(claim["views"]) == {"full", "minus_evidence"} and all((site / p).exists() for p in claim["views"].values())
    assert detail["judge"][0]["valid"] is False and detail["scores"][1]["note"] == "answer_failed"
    assert _data(site, "data/bench__smoke/1.js").keys() == {f"bench/i{i:02d}" for i in range(50, 60)}  # lazy chunks


def test_the_site_needs_no_network(site):
    for name in ("index.html", "app.js", "style.css"):
        text = (site / name).read_text()
        assert not re.search(r"(src|href)=\"(https?:)?//", text) and "fetch(" not in text and "XMLHttpRequest" not in text, name


def test_cli_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("explore_job", REPO / "jobs" / "explore.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([f"run={tmp_path}"]) == 2
    assert "no items.parquet" in capsys.readouterr().err
    assert module.main(["foo=1"]) == 2


# -------------------------------------------------------------------------- in a real browser


def _browser():
    """Headless Chromium through selenium, or a skip saying what is missing."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")
    binary = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip("no Chromium/chromedriver on PATH (Debian: apt-get install chromium chromium-driver; .ci/run installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000",
                "--host-resolver-rules=MAP * ~NOTFOUND", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(driver_path))


@pytest.fixture(scope="module")
def page(site):
    driver = _browser()
    try:
        driver.get((site / "index.html").as_uri())
        yield driver
    finally:
        driver.quit()


def _wait(driver, condition, timeout=10.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: condition(d))


def _ids(driver) -> list[str]:
    from selenium.webdriver.common.by import By

    return [tr.get_attribute("data-id") for tr in driver.find_elements(By.CSS_SELECTOR, "#list tbody tr")]


def _select(driver, element_id: str, value: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, element_id)).select_by_value(value)


def test_browser_lists_sorts_filters_and_shows_an_item(page):
    from selenium.webdriver.common.by import By

    driver = page
    _wait(driver, lambda d: len(_ids(d)) == 50)
    assert driver.find_element(By.ID, "count").text == f"{N} of {N} items"
    by_depict = sorted(range(N), key=depict_of, reverse=True)
    assert _ids(driver)[:5] == [f"bench/i{i:02d}" for i in by_depict[:5]]  # default: depict, descending
    driver.find_element(By.ID, "next").click()
    assert len(_ids(driver)) == N - 50 and "page 2 of 2" in driver.find_element(By.ID, "page").text

    driver.find_element(By.ID, "order").click()  # ascending
    assert _ids(driver)[0] == f"bench/i{by_depict[-1]:02d}"
    _select(driver, "sort", "metric:vqascore")
    assert _ids(driver)[0] == f"bench/i{by_depict[0]:02d}"  # vqascore = 1 - depict
    assert driver.execute_script("return DEPICT.state.order.slice(-1)[0]") == 0  # item 0's null vqascore sorts last
    _select(driver, "sort", "human")
    humans = [int(i[-2:]) % 7 for i in _ids(driver)]
    assert humans == sorted(humans)
    _select(driver, "sort", "disagreement")
    assert driver.find_elements(By.CSS_SELECTOR, "#list thead th")[5].text == "disagree"

    _select(driver, "tag", "count")
    assert driver.find_element(By.ID, "count").text == f"{len(range(0, N, 3))} of {N} items"
    assert all(int(i[-2:]) % 3 == 0 for i in _ids(driver))
    _select(driver, "tag", "")
    _select(driver, "template", "neg")
    assert all(int(i[-2:]) % 4 == 0 for i in _ids(driver)) and len(_ids(driver)) == N // 4
    _select(driver, "template", "")
    driver.find_element(By.ID, "min").send_keys("0.9")  # depict >= 0.9
    assert sorted(_ids(driver)) == sorted(f"bench/i{i:02d}" for i in range(N) if depict_of(i) >= 0.9)
    driver.find_element(By.ID, "min").clear()
    driver.find_element(By.ID, "errors-only").click()
    assert _ids(driver) == ["bench/i05"]
    driver.find_element(By.ID, "errors-only").click()
    driver.find_element(By.ID, "search").send_keys("two dogs")
    assert len(_ids(driver)) == N // 2
    driver.find_element(By.ID, "search").clear()
    driver.find_element(By.ID, "search").send_keys(" ")  # an input event restores the full list
    _wait(driver, lambda d: d.find_element(By.ID, "count").text == f"{N} of {N} items")

    _select(driver, "sort", "id")
    driver.find_element(By.CSS_SELECTOR, '#list tbody tr[data-id="bench/i00"]').click()
    _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#detail tr.question"))
    questions = driver.find_elements(By.CSS_SELECTOR, "#detail tr.question")
    assert len(questions) == 4 and "Is there thing 1?" in questions[0].text
    widths = [b.get_attribute("style") for b in driver.find_elements(By.CSS_SELECTOR, "#detail .bar.pv > span")]
    assert widths[:3] == ["width: 25%;", "width: 50%;", "width: 75%;"]
    assert driver.find_elements(By.CSS_SELECTOR, "#detail .bar.w > span") and driver.find_elements(By.CSS_SELECTOR, "#detail .bar.a > span")
    assert "depends on 1" in questions[3].text  # the DSG parent
    assert len(driver.find_elements(By.CSS_SELECTOR, "#detail svg rect.evidence")) == 1
    assert len(driver.find_elements(By.CSS_SELECTOR, "#detail .views img")) == 2
    detail = driver.find_element(By.ID, "detail").text
    assert "answer_failed" in detail and "invalid: invalid_judge_output" in detail
    driver.find_element(By.CSS_SELECTOR, '#list tbody tr[data-id="bench/i05"]').click()
    _wait(driver, lambda d: "judge/invalid_judge_output" in d.find_element(By.ID, "detail").text)

    images_ok = driver.execute_script("return Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
    assert images_ok
    urls = driver.execute_script("return Array.from(document.querySelectorAll('[src],[href]')).map(e => e.src || e.href)")
    assert len(urls) > 10 and all(u.startswith(("file://", "data:")) for u in urls)  # everything from disk
    problems = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert problems == []
