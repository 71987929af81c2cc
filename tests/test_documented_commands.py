"""Every command that README.md and docs/*.md show is checked against the code.

A documented command must not drift from the code: each one is a test case, its id the
file and line it is written on (`docs/reproducing.md:25`; `README.md:22+1` for the second
command of an `&&` chain), that runs the job's own `main` (the same function `python
jobs/<job>.py` and `depict <job>` run) with the documented arguments: its argument
handling, config loading and validation all run, and the case passes when `main` reaches
the function that starts the real work (replaced by a stub that stops there: no model, no
Ray, no data) or exits 0 (`--help`). A usage error, a ConfigError or any other exit code
fails the case with the job's own message.

Where commands are found
  - fenced blocks tagged bash/sh/shell/console: every line is a command, and a line whose
    tool is not listed below fails (classify a new tool here);
  - untagged fenced blocks and indented (four-space) blocks: the lines that start with a
    known tool (the rest is program output, file trees, error messages);
  - inline code spans (also in tables, also wrapped over a line break) that start with
    `python `, `depict <job>` / `depict --help`, or another known tool;
  - ```python, ```yaml and other blocks are code or data, not commands, and are not read.

How a command line is read
  - a trailing `\\` joins the next line; `# comments` and a leading `$ ` are dropped;
  - `&&`, `||`, `;` and `|` written between words split a line into several commands, each
    its own case; a trailing `&` is dropped;
  - leading `NAME=value` words are environment variables. `DEPICT_CONF=<folder>` (your own
    configs) becomes a temporary folder holding, for each preset the command names that the
    shipped configs lack (`sweep=nightly`), a copy of the shipped default preset: the user's
    file is unknown, the rest of the command is checked against the real code;
  - `ray job submit [options] -- <entrypoint>`: the entrypoint is checked like any command,
    and the local files that --working-dir / --runtime-env name must exist. `ray job submit`
    without an entrypoint (a mention in prose) is skipped as a ray command;
  - placeholders `<...>`: one that is a whole `key=` value, or a whole list item, becomes a
    value for that key (PLACEHOLDER_VALUES: `smoke` for backbones=[<name>], a temporary path
    for store=<store>, run=<out_dir>, ...); one inside a value (`s3://<bucket>/x`) becomes the
    word `placeholder`; `key=...` and `key=[...]` are placeholders too;
  - `...` as an argument means "the other arguments": it stands for the arguments of the
    nearest command of the same job written above it in the same file (curation.md's
    `ray job submit ... -- python jobs/curate.py ...` gets the command shown just before it),
    and for nothing when there is none;
  - `a|b` inside a word (`verify|gc|compact`, `answer_rule=dsg|strict`) lists alternatives:
    every combination is checked;
  - `[key=value]` words are optional: checked without them and with all of them;
    `[key=value ...]` (a generic synopsis) is dropped;
  - `<job>` in `python jobs/<job>.py` and `depict <job>` stands for any job: every job in
    jobs/ must resolve (its file exists and `depict` lists it); no arguments are checked.

What is checked per job (WORK below names the stubbed work functions)
  sweep, curate, preflight: the preset and overrides through `load_config` (and the
  curation schema), with every range and name check; score: `jobs/score.py`'s parser and the
  `Scorer` it builds (the same config loading), stopped before any pair is scored;
  metaeval, tables, store, explore, demo_corpus: their own argument parsers and range checks. A `python
  jobs/X.py` whose file does not exist fails, as does `depict X` for an unknown X. Jobs run
  in the case's temporary folder, so a relative path of a command never touches the checkout.

Every command's repository files must exist (words starting infra/, .ci/, bench/, tests/,
jobs/, ...; globs allowed). Skipped after that check: other tools (SKIPPED_TOOLS: pip, ruff, ray other
than `job submit`, kubectl, helm, docker, aws, sed, export, git), `python -m ...` (pytest),
and `python` running a script outside jobs/ (bench/, tests/).
"""
from __future__ import annotations

import glob
import importlib
import itertools
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOC_FILES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]

SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
SKIPPED_TOOLS = {
    "pip": "pip (installation)",
    "pip3": "pip (installation)",
    "ruff": "ruff (lint)",
    "ray": "ray other than `job submit -- <entrypoint>` (cluster management)",
    "kubectl": "kubectl (Kubernetes)",
    "helm": "helm (Kubernetes)",
    "docker": "docker (image build)",
    "aws": "aws (AWS CLI)",
    "sed": "sed (editing manifests)",
    "export": "export (shell variables)",
    "git": "git",
}
# How a placeholder that is a whole value (or list item) of `key=` is filled; keys not listed
# get a path in the case's temporary folder, named after the key (store=<store>: <tmp>/store).
PLACEHOLDER_VALUES = {"backbones": "smoke", "benchmarks": "demo", "metrics": "depict"}
# The functions where each job's real work starts: replaced by a stub that stops the job there.
WORK = {
    "sweep": [("jobs.sweep", "run_sweep")],
    "curate": [("jobs.curate", "run_curation")],
    "preflight": [("jobs.preflight", "run_preflight")],
    # jobs/score.py's run_pairs reads the pairs file, builds the Scorer (config loading and
    # validation), then scores: the file reads return nothing, the scoring stops the job.
    "score": [("pipeline.pairs", "read_pairs_file", None), ("pipeline.pairs", "read_table_file", None),
              ("pipeline.api", "Scorer.score")],
    "metaeval": [("jobs.metaeval", "evaluate_released"), ("jobs.metaeval", "evaluate_files")],
    "tables": [("jobs.tables", "write_reports"), ("jobs.tables", "write_open_share")],
    "explore": [("jobs.explore", "write_site")],
    "store": [("jobs.store", "compact"), ("jobs.store", "gc"), ("jobs.store", "verify"), ("jobs.store", "prune_gone_shards")],
    "micro_vlm": [("jobs.micro_vlm", "train_micro_vlm"), ("jobs.micro_vlm", "evaluate_micro_vlm")],
    "micro_grounding": [("jobs.micro_grounding", "train_micro_grounding"), ("jobs.micro_grounding", "evaluate_micro_grounding")],
    # the settings are checked, then the folder is made ready: stopped there, nothing is written
    "demo_corpus": [("pipeline.curation.demo_corpus", "make_room")],
}  # fmt: skip
PRESET_KEYS = {"sweep": "sweep", "curate": "curation", "preflight": "sweep", "score": None}
# Repository folders whose files other tools' commands may name (checked to exist).
REPO_PREFIXES = ("infra/", ".ci/", "bench/", "tests/", "conf/", "docs/", "jobs/", "pipeline/", "operators/")

_PLACEHOLDER = re.compile(r"<[A-Za-z_][^<>\n]*>")
_MASK = "\x00{}\x00"
_MASKED = re.compile("\x00(\\d+)\x00")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SEPARATORS = {"&&", "||", ";", "|"}


# ---------------------------------------------------------------------------------------------
# Finding commands


@dataclass
class Command:
    file: str
    line: int
    text: str  # the command as written (continuations joined, placeholders as written)
    where: str  # "shell block", "block", "inline"
    index: int = 0  # its position among the commands written on the same line
    words: list[str] = field(default_factory=list)  # after splitting; placeholders masked
    placeholders: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}" + (f"+{self.index}" if self.index else "")


def _code_lines(lines: list[str]):
    """(blocks, prose): blocks are (language or None for indented, [(line number, text)]);
    prose is the text with every code line blanked (line numbers kept)."""
    blocks, prose = [], []
    fence, lang, body = None, None, []
    indented: list = []
    previous_blank = True
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if fence is not None:
            if stripped.startswith(fence):
                blocks.append((lang, body))
                fence = None
            else:
                body.append((number, line))
            prose.append("")
            continue
        opening = re.match(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)", line)
        if opening:
            if indented:
                blocks.append((None, indented))
                indented = []
            fence, lang, body = opening.group(1), opening.group(2).lower(), []
            prose.append("")
            continue
        if line.startswith("    ") and stripped and (previous_blank or indented):
            indented.append((number, line[4:]))
            prose.append("")
            continue
        if indented and not stripped:
            prose.append("")
            previous_blank = True
            continue
        if indented:
            blocks.append((None, indented))
            indented = []
        prose.append(line)
        previous_blank = not stripped
    if indented:
        blocks.append((None, indented))
    return blocks, prose


def _logical_lines(body: list[tuple[int, str]]):
    """Lines joined at a trailing backslash: (first line number, text)."""
    joined, start, parts = [], None, []
    for number, text in body:
        start = number if start is None else start
        if text.rstrip().endswith("\\"):
            parts.append(text.rstrip()[:-1])
            continue
        parts.append(text)
        joined.append((start, " ".join(p.strip() for p in parts)))
        start, parts = None, []
    if parts:
        joined.append((start, " ".join(p.strip() for p in parts)))
    return joined


def _split(text: str) -> tuple[list[list[str]], list[str]]:
    """Shell words of each command in `text` (split at && || ; |), placeholders masked."""
    placeholders: list[str] = []

    def mask(match):
        placeholders.append(match.group(0))
        return _MASK.format(len(placeholders) - 1)

    masked = _PLACEHOLDER.sub(mask, text.strip())
    if masked.startswith("$ "):
        masked = masked[2:]
    lexer = shlex.shlex(masked, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        words = list(lexer)
    except ValueError as exc:  # an unclosed quote: not a command a shell would run
        return [["<unreadable>", f"{exc}: {text.strip()}"]], placeholders
    commands, current = [], []
    for word in words:
        if word in _SEPARATORS:
            commands.append(current)
            current = []
        elif word != "&":
            current.append(word)
    commands.append(current)
    return [c for c in commands if c], placeholders


def _tool(words: list[str]) -> str | None:
    rest = _without_env(words)[1]
    return rest[0] if rest else None


def _without_env(words: list[str]) -> tuple[dict[str, str], list[str]]:
    env = {}
    i = 0
    while i < len(words) and _ENV.match(words[i]):
        key, _, value = words[i].partition("=")
        env[key] = value
        i += 1
    return env, words[i:]


def _known_tool(words: list[str]) -> bool:
    tool = _tool(words)
    if tool in ("python", "python3"):
        return True
    if tool == "depict":  # `depict` alone is the metric id; the command always has a job or --help
        return len(_without_env(words)[1]) > 1
    return tool in SKIPPED_TOOLS and len(_without_env(words)[1]) > 1  # a lone `ray` is the package, not a command


def find_commands(file: str, text: str | None = None) -> list[Command]:
    """The commands written in `file` (a path under the repository; or `text`, named `file`)."""
    lines = (text if text is not None else (REPO / file).read_text(encoding="utf-8")).splitlines()
    blocks, prose = _code_lines(lines)
    found: list[Command] = []
    for lang, body in blocks:
        if lang not in SHELL_LANGS and lang not in ("", None):
            continue  # python, yaml, json, text: not commands
        for number, line in _logical_lines(body):
            if not line.strip() or line.strip().startswith("#"):
                continue
            every = lang in SHELL_LANGS
            first = _without_env(line.split())[1][:1]
            if not every and not (first and (first[0] in ("python", "python3", "depict") or first[0] in SKIPPED_TOOLS)):
                continue  # output, a file tree, an error message
            commands, placeholders = _split(line)
            for index, words in enumerate(c for c in commands if every or _known_tool(c)):
                where = "shell block" if every else "block"
                found.append(Command(file, number, line.strip(), where, index, words, placeholders))
    paragraphs = "\n".join(prose)
    for match in re.finditer(r"(?<!`)`((?:[^`\n]|\n(?!\s*\n))+)`(?!`)", paragraphs):  # a span ends with its paragraph
        span = " ".join(match.group(1).replace("\\|", "|").split())
        number = paragraphs.count("\n", 0, match.start()) + 1
        if not span:
            continue
        commands, placeholders = _split(span)
        if not commands or not _known_tool(commands[0]):
            continue
        for index, words in enumerate(commands):
            found.append(Command(file, number, span, "inline", index, words, placeholders))
    found.sort(key=lambda c: (c.line, c.where == "inline", c.index))
    for _, same_line in itertools.groupby(found, key=lambda c: c.line):  # ids: file:line, file:line+1, ...
        for index, command in enumerate(same_line):
            command.index = index
    return found


def _job_names() -> list[str]:
    import jobs

    return jobs.names()


# ---------------------------------------------------------------------------------------------
# Reading a command: which job, which arguments


@dataclass
class JobCall:
    job: str  # a job name, or "<job>" for the generic form
    form: str  # "python" or "depict"
    args: list[str]  # placeholders still masked
    env: dict[str, str]
    elided: bool  # an argument was `...`


def classify(command: Command) -> tuple[str, JobCall | str]:
    """("job", JobCall), ("skip", reason) or ("fail", reason)."""
    env, words = _without_env(command.words)
    if not words:
        return "fail", f"no command in {command.text!r}"
    tool = words[0]
    if tool == "<unreadable>":
        return "fail", words[1]
    if tool == "ray" and words[1:3] == ["job", "submit"]:
        if "--" not in words:
            return "skip", SKIPPED_TOOLS["ray"] + " (ray job submit named without an entrypoint)"
        cut = words.index("--")
        problem = _ray_options_problem(words[3:cut])
        if problem:
            return "fail", problem
        inner = Command(command.file, command.line, command.text, command.where, command.index, words[cut + 1 :], command.placeholders)
        kind, what = classify(inner)
        if kind == "skip":
            return "fail", f"`ray job submit` runs {' '.join(words[cut + 1:])!r}, which is not a job of this project"
        return kind, what
    if tool in ("python", "python3"):
        if len(words) < 2:
            return "fail", "python without a script"
        script = words[1]
        if script == "-m":
            return "skip", "python -m (a module: pytest)"
        match = re.fullmatch(r"(?:\./)?jobs/(.+)\.py", script)
        if match:
            name = _unmask(match.group(1), command.placeholders)
            if name == "<job>":
                return "job", JobCall("<job>", "python", words[2:], env, False)
            if not (REPO / "jobs" / f"{name}.py").is_file() or name.startswith("_"):
                return "fail", f"jobs/{name}.py does not exist (jobs: {', '.join(_job_names())})"
            return "job", _job_call(name, "python", words[2:], env)
        return "skip", "python running a script outside jobs/ (bench/, tests/)"
    if tool == "depict":
        if len(words) < 2:
            return "fail", "depict without a job"
        job = _unmask(words[1], command.placeholders)
        if job in ("-h", "--help"):
            return "job", JobCall("--help", "depict", [], env, False)
        if job == "<job>":
            return "job", JobCall("<job>", "depict", words[2:], env, False)
        return "job", _job_call(job, "depict", words[2:], env)
    if tool in SKIPPED_TOOLS:
        return "skip", SKIPPED_TOOLS[tool]
    return "fail", f"unknown tool {tool!r} in a shell block: check it here, or list it in SKIPPED_TOOLS"


def _job_call(job: str, form: str, args: list[str], env: dict[str, str]) -> JobCall:
    elided = "..." in args
    return JobCall(job, form, [a for a in args if a != "..."], env, elided)


def _unmask(word: str, placeholders: list[str]) -> str:
    return _MASKED.sub(lambda m: placeholders[int(m.group(1))], word)


def _ray_options_problem(options: list[str]) -> str | None:
    for i, option in enumerate(options):
        name, _, value = option.partition("=")
        if name in ("--working-dir", "--runtime-env"):
            value = value or (options[i + 1] if i + 1 < len(options) else "")
            if not (REPO / value).exists():
                return f"ray job submit {name} {value}: no such file in the repository"
    return None


def missing_repo_paths(command: Command) -> list[str]:
    """Repository files named by a command (infra/..., .ci/...) that do not exist."""
    missing = []
    for word in command.words:
        for candidate in [word, *word.split("=")[1:]]:
            candidate = candidate.strip("'\"")
            if _MASKED.search(candidate) or not candidate.startswith(REPO_PREFIXES):
                continue
            if not glob.glob(str(REPO / candidate)):
                missing.append(candidate)
    return missing


# ---------------------------------------------------------------------------------------------
# Arguments: placeholders, alternatives, optional words


def _fill(word: str, placeholders: list[str], tmp: Path) -> str:
    """A `key=value` (or bare) word with its placeholders filled."""
    key, sep, value = word.partition("=")
    if not sep:
        return _MASKED.sub("placeholder", word)
    short = key.split(".")[-1]

    def whole(item: str) -> bool:
        return bool(_MASKED.fullmatch(item)) or item == "..."

    def value_for() -> str:
        return PLACEHOLDER_VALUES.get(short, str(tmp / short))

    if whole(value):
        return f"{key}={value_for()}"
    if value.startswith("[") and value.endswith("]"):
        items = [i.strip() for i in value[1:-1].split(",")]
        items = [value_for() if whole(i) else _MASKED.sub("placeholder", i) for i in items]
        return f"{key}=[{','.join(items)}]"
    return f"{key}={_MASKED.sub('placeholder', value)}"


def variants(call: JobCall, placeholders: list[str], tmp: Path) -> list[list[str]]:
    """Every argument list the documented command stands for (alternatives x optional words)."""
    required: list[list[str]] = []  # each: the alternatives of one word
    optional: list[list[str]] = []
    args = list(call.args)
    i = 0
    while i < len(args):
        word = args[i]
        if word.startswith("["):  # an optional group, maybe over several words: [key=value ...]
            group = [word]
            while not group[-1].endswith("]") and i + 1 < len(args):
                i += 1
                group.append(args[i])
            inner = " ".join(group)[1:-1].split()
            i += 1
            if any(w == "..." or w.endswith("...") for w in inner) or "key=value" in inner:
                continue  # a generic synopsis: `[key=value ...]`
            optional.extend(_alternatives(w) for w in inner)
            continue
        required.append(_alternatives(word))
        i += 1
    combos = []
    for chosen in (required, required + optional) if optional else (required,):
        for words in itertools.islice(itertools.product(*chosen), 32):
            combos.append([_fill(w, placeholders, tmp) for w in words])
    return combos


def _alternatives(word: str) -> list[str]:
    if "|" not in word:
        return [word]
    key, sep, value = word.partition("=")
    if sep and "|" in value:
        return [f"{key}={v}" for v in value.split("|")]
    return word.split("|")


# ---------------------------------------------------------------------------------------------
# Running a job's main up to its work


class WorkReached(BaseException):
    """Raised by the stubbed work function: the arguments were accepted. A BaseException, so
    that no `except Exception` in a job turns it into an exit code."""


def _stub_work(job: str, monkeypatch) -> None:
    def reached(*args, **kwargs):
        raise WorkReached(job)

    for target in WORK[job]:
        module_name, attr, *returns = target
        module = importlib.import_module(module_name)
        owner_name, _, name = attr.rpartition(".")
        owner = getattr(module, owner_name) if owner_name else module
        monkeypatch.setattr(owner, name, (lambda *a, _r=returns[0], **k: _r) if returns else reached)


def _conf_folder(call_args: list[str], tmp: Path, job: str) -> str:
    """A stand-in for the user's DEPICT_CONF folder: a copy of the shipped default preset
    under each preset name the command uses that the shipped configs lack."""
    from pipeline.config import CONF_DIR, DEFAULT_SWEEP

    folder = tmp / "user_conf"
    folder.mkdir(exist_ok=True)
    preset_key = PRESET_KEYS.get(job)
    if preset_key:
        default = DEFAULT_SWEEP if preset_key == "sweep" else "default"
        for arg in call_args:
            key, _, name = arg.partition("=")
            if key == preset_key and not (Path(CONF_DIR) / preset_key / f"{name}.yaml").exists():
                (folder / preset_key).mkdir(exist_ok=True)
                (folder / preset_key / f"{name}.yaml").write_text((Path(CONF_DIR) / preset_key / f"{default}.yaml").read_text())
    return str(folder)


def run_job(job: str, form: str, argv: list[str], monkeypatch, capsys) -> tuple[bool, str]:
    """(accepted, what the job said): accepted when main reached its work or exited 0."""
    import jobs

    capsys.readouterr()
    try:
        if form == "depict":
            code = jobs.main([job, *argv] if job != "--help" else ["--help"])
        else:
            code = importlib.import_module(f"jobs.{job}").main(argv)
    except WorkReached:
        return True, ""
    finally:
        said = capsys.readouterr()
    return code == 0, f"exit code {code}: {(said.err or said.out).strip()[-2000:]}"


# ---------------------------------------------------------------------------------------------
# The cases


def _all_commands() -> list[Command]:
    return [c for f in DOC_FILES for c in find_commands(f)]


def _with_elisions(commands: list[Command]) -> list[tuple[Command, str, object]]:
    """Each command classified; `...` filled from the nearest command of the same job above."""
    out, last_args = [], {}
    for command in commands:
        kind, what = classify(command)
        if kind == "job" and isinstance(what, JobCall) and what.job not in ("<job>", "--help"):
            key = (command.file, what.job)
            if what.elided and key in last_args:
                what.args = [*last_args[key], *what.args]
            elif not what.elided:
                last_args[key] = list(what.args)
        out.append((command, kind, what))
    return out


CASES = _with_elisions(_all_commands())


def check(command: Command, kind: str, what, tmp_path: Path, monkeypatch, capsys) -> str | None:
    """None when the command is accepted, else why not; pytest.skip for other tools."""
    missing = missing_repo_paths(command)
    if missing:
        return f"{command.id}: {command.text!r} names {missing}, which do not exist"
    if kind == "fail":
        return f"{command.id}: {command.text!r}: {what}"
    if kind == "skip":
        pytest.skip(f"{what}: not run (the files it names exist)")
    call: JobCall = what
    names = _job_names()
    if call.job == "--help":
        ok, said = run_job("--help", "depict", [], monkeypatch, capsys)
        return None if ok else f"{command.id}: `depict --help`: {said}"
    if call.job == "<job>":  # the generic form: every job resolves both ways
        import jobs

        for name in names:
            if not (REPO / "jobs" / f"{name}.py").is_file() or not callable(importlib.import_module(f"jobs.{name}").main):
                return f"{command.id}: jobs/{name}.py has no main"
            if name not in jobs.help_text():
                return f"{command.id}: `depict --help` does not list {name}"
        return None
    if call.job not in names:
        return f"{command.id}: {command.text!r}: no job {call.job!r} (jobs: {', '.join(names)})"
    if call.job not in WORK:
        return f"{command.id}: job {call.job!r} has no WORK entry in this test: name the function where its work starts"
    _stub_work(call.job, monkeypatch)
    monkeypatch.chdir(tmp_path)  # relative paths of the command land here, never in the checkout
    for argv in variants(call, command.placeholders, tmp_path):
        if "DEPICT_CONF" in call.env:
            monkeypatch.setenv("DEPICT_CONF", _conf_folder(argv, tmp_path, call.job))
        else:
            monkeypatch.delenv("DEPICT_CONF", raising=False)
        ok, said = run_job(call.job, call.form, argv, monkeypatch, capsys)
        if not ok:
            shown = f"{'python jobs/' + call.job + '.py' if call.form == 'python' else 'depict ' + call.job} {' '.join(argv)}"
            return f"{command.id}: {command.text!r}\n  checked as: {shown}\n  {said}"
    return None


@pytest.mark.parametrize(("command", "kind", "what"), CASES, ids=[c.id for c, _, _ in CASES])
def test_documented_command(command: Command, kind: str, what, tmp_path, monkeypatch, capsys):
    problem = check(command, kind, what, tmp_path, monkeypatch, capsys)
    assert problem is None, problem


def test_commands_are_found_in_every_file():
    """The extraction itself: known commands of each kind are found where they are written."""
    by_file = {}
    for command, kind, _ in CASES:
        by_file.setdefault(command.file, []).append((command.text, kind))
    texts = {f: " || ".join(t for t, _ in v) for f, v in by_file.items()}
    assert "python jobs/sweep.py sweep=laptop" in texts["README.md"]  # fenced bash block
    assert "released=tifa" in texts["docs/reproducing.md"]  # indented block
    assert "depict sweep sweep=nightly" in texts["README.md"]  # inline, with an environment variable
    assert "python jobs/store.py compact store=<store>" in texts["docs/storage.md"]  # inline across a line break
    assert all(kind != "job" or "jobs/" in text or "depict" in text for v in by_file.values() for text, kind in v)


def test_every_job_has_its_work_named():
    assert set(_job_names()) == set(WORK)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("python jobs/store.py gc store=<store> [min_age_s=3600] [dry_run=true]",
         [["gc", "store={tmp}/store"], ["gc", "store={tmp}/store", "min_age_s=3600", "dry_run=true"]]),
        ("python jobs/store.py verify|gc store=s3://<bucket>/store",
         [["verify", "store=s3://placeholder/store"], ["gc", "store=s3://placeholder/store"]]),
        ("python jobs/preflight.py backbones=[...]", [["backbones=[smoke]"]]),
        ("python jobs/preflight.py backbones=[<name>] [key=value ...]", [["backbones=[smoke]"]]),
    ],
)  # fmt: skip
def test_placeholders_alternatives_and_optional_words(text, expected, tmp_path):
    commands, placeholders = _split(text)
    kind, call = classify(Command("x.md", 1, text, "inline", 0, commands[0], placeholders))
    assert kind == "job"
    got = variants(call, placeholders, tmp_path)
    assert got == [[w.replace("{tmp}", str(tmp_path)) for w in v] for v in expected]


DRIFTED = """
Prose: `python jobs/sweep.py sweep=nope` and `depict nope x=1`, and one over a line
break: `python jobs/sweep.py
lam=2`.

```bash
python jobs/nope.py x=1
python jobs/curate.py curation=smoke
frobnicate --all
ray job submit --working-dir . --runtime-env infra/nope.yaml -- python jobs/sweep.py
ray job submit -- pip install x
python jobs/store.py compact
python jobs/store.py verify|vacuum store=<store>
python jobs/metaeval.py scores=s.csv human=h.csv n_resamples=5
python jobs/tables.py run=r [formats=[md,pdf]]
python jobs/explore.py run=r where=x
python jobs/preflight.py backbones=[nope]
python jobs/score.py pairs=p.csv backbone=nope
kubectl apply -f infra/kuberay/nope.yaml
DEPICT_CONF=~/mine depict sweep sweep=nightly lam=3
```
"""
ACCEPTED = """
```bash
python jobs/curate.py curation=default inputs=[s3://<bucket>/in/]
DEPICT_CONF=~/mine depict sweep sweep=nightly lam=0.3
```

    python jobs/store.py verify|gc store=<store dir or s3://bucket/prefix>

Then `ray job submit --working-dir . -- python jobs/curate.py ...` (the arguments above), or
`depict metaeval released=tifa scores=<file> n_resamples=0`; `ray up` is not run.
"""


def _outcomes(text: str, tmp_path, monkeypatch, capsys) -> list[tuple[str, str | None]]:
    outcomes = []
    for command, kind, what in _with_elisions(find_commands("x.md", text)):
        with monkeypatch.context() as patched:
            try:
                outcomes.append((command.text, check(command, kind, what, tmp_path, patched, capsys)))
            except pytest.skip.Exception as skipped:
                outcomes.append((command.text, f"skipped: {skipped}"))
    return outcomes


def test_drifted_commands_fail(tmp_path, monkeypatch, capsys):
    outcomes = _outcomes(DRIFTED, tmp_path, monkeypatch, capsys)
    assert len(outcomes) == 17
    accepted = [text for text, problem in outcomes if problem is None or problem.startswith("skipped")]
    assert accepted == [], accepted
    said = "\n".join(problem for _, problem in outcomes)
    for reason in ("names ['jobs/nope.py']", "unknown tool 'frobnicate'", "names ['infra/nope.yaml']",
                   "which is not a job of this project", "names ['infra/kuberay/nope.yaml']", "no job 'nope'",
                   "config error at 'lam'", "config error at 'n_resamples'", "config error at 'inputs'"):  # fmt: skip
        assert reason in said, reason


def test_accepted_commands_and_what_stands_in_for_placeholders(tmp_path, monkeypatch, capsys):
    outcomes = _outcomes(ACCEPTED, tmp_path, monkeypatch, capsys)
    assert [problem for _, problem in outcomes] == [None, None, None, None, None, outcomes[-1][1]]
    assert outcomes[-1][1].startswith("skipped: ray other than")
    assert (tmp_path / "user_conf" / "sweep" / "nightly.yaml").exists()  # the user's preset, stood in for


@pytest.mark.parametrize("job", sorted(p.stem for p in (REPO / "jobs").glob("*.py") if p.stem != "__init__"))
def test_every_job_answers_help_with_its_docstring(job, capsys):
    """`depict <job> --help` is documented (jobs/__init__.py) for every job."""
    import importlib

    module = importlib.import_module(f"jobs.{job}")
    assert module.main(["--help"]) == 0
    assert capsys.readouterr().out.strip() == module.__doc__.strip()
