"""The project installs like a library: a wheel that works outside the repository.

The wheel is built from a copy of what the build reads, installed with --no-deps into a fresh
virtual environment that sees the development environment's dependencies (one .pth line, so
torch and Ray are not installed again) but not the repository, then used from another folder:
the README's three-line API on the built-in tiny model, and the `depict` command.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ("pyproject.toml", "README.md", "operators", "pipeline", "conf", "jobs")  # what setuptools reads
CODE_FOLDERS = ("operators", "pipeline", "jobs")


def packages_in_pyproject() -> set[str]:
    return set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def package_folders() -> set[str]:
    """Every folder the wheel must hold, as a package name: code, data, and conf/ as pipeline.conf."""
    names = set()
    for top in CODE_FOLDERS:
        for folder in [REPO / top, *(REPO / top).rglob("*")]:
            if folder.is_dir() and folder.name != "__pycache__" and any(f.is_file() for f in folder.iterdir()):
                names.add(".".join(folder.relative_to(REPO).parts))
    names.add("pipeline.conf")
    names |= {f"pipeline.conf.{d.name}" for d in (REPO / "conf").iterdir() if d.is_dir()}
    return names


def test_pyproject_lists_every_package_and_data_folder():
    """pyproject.toml lists packages by hand (conf/ is mapped, so not discovered): a folder
    missing there would be missing from the wheel, though the clone still works."""
    missing = package_folders() - packages_in_pyproject()
    assert not missing, f"add {sorted(missing)} to [tool.setuptools] packages in pyproject.toml: the wheel would lack them"


def test_user_conf_folder_adds_and_shadows_files(tmp_path, monkeypatch):
    """$DEPICT_CONF's folders come first: a new backbone is added, a shipped preset shadowed,
    and every other file still comes from the shipped conf/."""
    from pipeline.config import CONF_DIR, load_config

    mine = tmp_path / "my_conf"
    (mine / "backbones").mkdir(parents=True)
    (mine / "sweep").mkdir()
    (mine / "backbones" / "mine.yaml").write_text((CONF_DIR / "backbones" / "smoke.yaml").read_text().replace("name: smoke", "name: mine"))
    (mine / "sweep" / "demo.yaml").write_text((CONF_DIR / "sweep" / "demo.yaml").read_text() + "lam: 0.25\n")  # shadows the default preset
    monkeypatch.setenv("DEPICT_CONF", str(mine))
    cfg = load_config(["backbones=[mine]", "questions.generator=mine"])
    assert set(cfg.backbones) == {"mine"} and cfg.sweep.lam == 0.25
    assert set(cfg.benchmarks) and cfg.prompts.version  # shipped benchmarks and prompts


def test_user_conf_errors_name_the_folders(tmp_path, monkeypatch):
    from pipeline.config import ConfigError, load_config

    monkeypatch.setenv("DEPICT_CONF", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="'DEPICT_CONF'.*no folder .*absent"):
        load_config([])
    (tmp_path / "mine" / "backbones").mkdir(parents=True)
    (tmp_path / "mine" / "backbones" / "extra.yaml").write_text("name: extra\nmodel_id: x\n")
    monkeypatch.setenv("DEPICT_CONF", str(tmp_path / "mine"))
    with pytest.raises(ConfigError, match=r"mine/backbones/nope.yaml or .*conf/backbones/nope.yaml \(available: .*extra.*smoke"):
        load_config(["backbones=[nope]"])
    # conf_dir= is a complete folder of its own (tests): $DEPICT_CONF does not apply
    with pytest.raises(ConfigError, match=r"no file \S*mine/sweep/demo.yaml \(available: none\)"):
        load_config([], conf_dir=tmp_path / "mine")


def run(cmd: list, cwd: Path, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """`cmd` as a user runs it: without a PYTHONPATH of the developer's (one naming the checkout
    would let the fresh venv import the repository instead of the wheel)."""
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "PYTHONPATH"}
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def build_wheel(tmp: Path) -> Path:
    """`pip wheel . --no-deps --no-build-isolation` on a copy (an in-tree build would write
    build/ and the egg-info into the shared checkout)."""
    src = tmp / "src"
    for name in BUILD_INPUTS:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    run([sys.executable, "-m", "pip", "wheel", src, "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", tmp / "dist"], cwd=tmp)
    (wheel,) = (tmp / "dist").glob("depict_pipeline-*.whl")
    return wheel


def clean_venv(tmp: Path) -> Path:
    """A new venv whose only view of the development one is its site-packages directory: a
    directory added by a .pth line gets no .pth processing, so the editable install's finder
    (which maps `pipeline` to this repository) stays out."""
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp)
    python = venv / "bin" / "python"
    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).stdout.strip()
    Path(site, "dev-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


API = """
import sys
from pathlib import Path

repo = Path(sys.argv[1])
assert all(Path(p or ".").resolve() != repo for p in sys.path), f"the repository is on sys.path: {sys.path}"
import pipeline
assert Path(pipeline.__file__).is_relative_to(sys.prefix), f"pipeline comes from {pipeline.__file__}, not the venv"

from PIL import Image
Image.new("RGB", (48, 48), "red").save("bus.jpg")
Image.new("RGB", (48, 48), "white").save("cats.png")

from pipeline import Scorer
scorer = Scorer("smoke", metrics=["depict", "vqascore"])
scores = scorer(images=["bus.jpg", "cats.png"], texts=["a red bus", "two cats on a sofa"])

print(scores.columns)
print(scores)
assert scores.height == 2 and scores["error"].is_null().all(), scores
assert scores["vqascore"].is_not_null().all(), scores  # depict: random weights write no usable questions
"""


@pytest.mark.slow  # builds a wheel and a venv, and the tiny model if it is not cached yet
def test_wheel_works_outside_the_repository(tmp_path):
    wheel = build_wheel(tmp_path)
    names = run([sys.executable, "-m", "zipfile", "-l", wheel], cwd=tmp_path).stdout
    assert "pipeline/conf/api/default.yaml" in names and "pipeline/conf/backbones/smoke.yaml" in names, names
    assert "jobs/sweep.py" in names, names

    python = clean_venv(tmp_path)
    before = run([python, "-c", "import pipeline"], cwd=tmp_path, check=False)
    assert before.returncode != 0, "the fresh venv imports pipeline before the wheel is installed: it sees the repository"
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel], cwd=tmp_path)

    work = tmp_path / "elsewhere"
    work.mkdir()
    out = run([python, "-c", API, REPO], cwd=work).stdout
    assert "depict" in out

    depict = python.parent / "depict"
    assert "sweep" in run([depict, "--help"], cwd=work).stdout
    (work / "pairs.csv").write_text("image,caption\nbus.jpg,a red bus\ncats.png,two cats on a sofa\n")
    scored = run([depict, "score", "pairs=pairs.csv"], cwd=work)  # the same store: answered from the API's cache
    assert "2 scored" in scored.stdout and (work / "pairs.depict").is_dir(), scored.stdout

    # A folder of the user's own configs, on top of the shipped ones.
    (work / "my_conf" / "sweep").mkdir(parents=True)
    (work / "my_conf" / "sweep" / "mine.yaml").write_text("name: mine\nbackbones: [smoke]\nbenchmarks: [demo]\nlam: 2.0\n")
    env = {**os.environ, "DEPICT_CONF": str(work / "my_conf")}
    mine = run([depict, "sweep", "sweep=mine"], cwd=work, env=env, check=False)
    assert mine.returncode == 2 and "config error at 'lam'" in mine.stderr, mine.stderr  # read mine, then shipped backbones
