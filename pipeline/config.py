"""Typed configuration: OmegaConf structured configs over the YAML files in conf/.

A run's configuration is one `SweepConfig` (a preset from conf/sweep/ plus command-line
overrides) that names backbones and benchmarks; each of those is its own YAML file
(conf/backbones/<name>.yaml, conf/benchmarks/<name>.yaml), so adding a backbone is adding
a file. `load_config` resolves and validates everything before any work starts, and a bad
value fails with a `ConfigError` that names the key. Folders named in $DEPICT_CONF are
searched first, so users add or shadow config files without editing the shipped ones.
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from operators.engines.spec import BackboneSpec
from operators.judge_output import JUDGE_KINDS
from operators.views import FILLS
from pipeline.store.fs import join_url

log = logging.getLogger(__name__)

# Folders of the user's own configs, searched before the shipped ones (os.pathsep-separated).
CONF_ENV = "DEPICT_CONF"


def shipped_conf_dir() -> Path:
    """The configs that come with the code. An installed wheel holds conf/ as package data
    (pipeline/conf/, see pyproject.toml); a clone, `pip install -e` and the working dir that
    `ray job submit` uploads have the top-level conf/ beside the packages."""
    packaged = resources.files("pipeline") / "conf"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "conf"


CONF_DIR = shipped_conf_dir()

ENGINES = ("hf", "vllm", "scripted")
PROBABILITIES = ("normalized", "raw")
PROTOCOL_STATISTICS = {
    "correlation": ("srcc", "kendall", "pearson", "plcc", "pairwise_acc"),
    "winoground": ("text_acc", "image_acc", "group_acc"),
    "multiple_choice": ("accuracy",),
}
TIE_POLICIES = ("expected", "strict", "first")
QUESTION_SETS = ("depict", "dsg", "claims")

# Metric ids the scoring stage can produce (docs/DESIGN.md), and which question sets /
# answer kinds each needs. Merges "<decomposed>+vqascore" are accepted for every decomposed id.
DECOMPOSED_METRICS = {
    "agree": "depict",
    "agree_unweighted": "depict",
    "soft_tifa_am": "depict",
    "soft_tifa_gm": "depict",
    "hard_fixed_yes": "depict",
    "mean_commitment": "depict",
    "dsg": "dsg",
    "dsg_nodep": "dsg",
    "claim_mean_am": "claims",
    "claim_mean_gm": "claims",
    "claim_mean_hm": "claims",
    "claim_mean_min": "claims",
}
HOLISTIC_METRICS = ("vqascore", "vqascore_raw")
OTHER_METRICS = ("depict",)
# Evidence and judge metrics come from their own stages (detector boxes, judge generations),
# not from yes/no answers. grounding_only reads typed claims and may be merged with vqascore.
GROUNDING_METRICS = {"grounding_only": "claims"}
JUDGE_METRICS = {"judge_holistic": "holistic", "judge_decomposed": "decomposed"}
SELECT_MODES = ("all", "sample", "below")
NO_QUESTION_POLICIES = ("exclude", "zero")  # what the meta-evaluation does with an item whose metric had no questions
BREAKDOWNS = ("tags", "template")
# Modules in pipeline.benchmarks that read a release (pipeline/stages/ingest.py imports them by name).
LOADERS = ("demo", "genai_bench", "tifa160", "richhf", "winoground", "negbench")
# Fewer resamples than this make a BCa interval noise (and 0 made every interval null).
MIN_RESAMPLES = 10


def metric_question_set(metric: str) -> str | None:
    """The question set a metric needs (None for holistic-only metrics)."""
    if metric == "depict":
        return "depict"
    base = metric.split("+", 1)[0]
    return DECOMPOSED_METRICS.get(base) or GROUNDING_METRICS.get(base)


def is_known_metric(metric: str) -> bool:
    if metric in DECOMPOSED_METRICS or metric in HOLISTIC_METRICS or metric in OTHER_METRICS:
        return True
    if metric in GROUNDING_METRICS or metric in JUDGE_METRICS or metric == "grounding_only+vqascore":
        return True
    base, plus, holistic = metric.partition("+")
    return bool(plus) and holistic == "vqascore" and base in DECOMPOSED_METRICS


class ConfigError(ValueError):
    """A configuration value is wrong; `key` is its dotted path."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"config error at '{key}': {message}")


@dataclass
class ProtocolSpec:
    """How a benchmark is evaluated against its human signal."""

    # correlation (SRCC/PLCC/pairwise accuracy) | winoground | multiple_choice
    kind: str = "correlation"
    # correlation: srcc, kendall, pearson, plcc, pairwise_acc; winoground: text_acc, image_acc, group_acc;
    # multiple_choice: accuracy
    statistics: list[str] = field(default_factory=lambda: ["srcc", "kendall", "pearson", "plcc", "pairwise_acc"])
    # multiple choice ties: expected (1/k), strict (a tie fails), first (official NegBench argmax)
    tie_policy: str = "expected"
    # extra per-subset breakdowns: tags (GenAI-Bench skills), template (NegBench)
    breakdowns: list[str] = field(default_factory=list)
    # the statistic the paired bootstrap compares metrics on
    primary_statistic: str = "srcc"
    # items whose metric had no questions (score null, note "no_questions"): exclude (left
    # out and counted) or zero (scored 0, as DSG's own scorer does); recorded in the note
    no_questions: str = "exclude"  # one of NO_QUESTION_POLICIES


@dataclass
class BenchmarkSpec:
    name: str = "???"
    loader: str = "???"  # module in pipeline.benchmarks: genai_bench, tifa160, richhf, winoground, negbench, demo
    root: str = "???"  # local folder or s3:// prefix holding the official files
    options: dict = field(default_factory=dict)  # loader keyword arguments
    protocol: ProtocolSpec = field(default_factory=ProtocolSpec)
    limit_groups: int | None = None  # keep only the first N bootstrap groups (smoke runs)


@dataclass
class QuestionsSpec:
    """Where the questions (and DSG graphs, claims) come from."""

    # model: generated by `generator` at temperature 0 | benchmark: shipped with the benchmark
    source: str = "model"
    # One fixed generator for the whole sweep, so every backbone answers the same questions.
    generator: str = "qwen3_5-27b"
    # Instead, each backbone answers questions it generated itself.
    per_backbone: bool = False
    # Question sets to obtain; the sets the requested metrics need are always added.
    sets: list[str] = field(default_factory=lambda: ["depict", "dsg"])
    max_questions: int = 32


@dataclass
class BootstrapSpec:
    n_resamples: int = 2000
    seed: int = 0
    confidence: float = 0.95


@dataclass
class ComputeSpec:
    """Where and how wide the work runs."""

    address: str | None = None  # Ray address; None: $RAY_ADDRESS if set, else a local Ray
    num_cpus: int | None = None  # local Ray only
    engines_per_backbone: int = 1  # actor-pool size: engine replicas of one backbone
    # GPUs per engine replica; None: tensor_parallel_size for vllm, 0 for hf/scripted on CPU
    gpus_per_engine: float | None = None
    # An engine asking more GPUs than any node has fails at once (on a cluster without GPUs a vLLM
    # engine runs on vLLM's CPU build when that is installed). true: wait for nodes that an
    # autoscaler will add instead.
    wait_for_gpus: bool = False
    cpus_per_engine: float = 1.0
    # Math threads in each engine (and detector) process: Ray gives an actor one per CPU it reserves,
    # so an engine on a CPU uses one core. A number sets it; 0: every core of the engine's node
    # (a laptop: sweep=laptop sets it); None: Ray's one per reserved CPU.
    threads_per_engine: int | None = None
    rows_per_part: int = 256  # requests per stored part (resume granularity: a kill loses at most the unfinished parts)
    rows_per_batch: int = 4096  # requests per worker call (Ray's fixed cost is paid per batch); holds whole parts
    engine_memory_gb: float | None = None  # memory Ray reserves per engine actor; None: no reservation
    progress_bars: bool = True
    # Memory ceilings (docs/cluster.md, "Memory"): backpressure instead of OOM kills.
    object_store_memory_gb: float | None = None  # local Ray only; None: Ray's default (30% of RAM)
    data_object_store_fraction: float = 0.5  # of the object store, what Ray Data may hold before it waits
    task_memory_gb: float = 2.0  # reserved per shard-reading/publishing/hashing task
    oom_retries: int = 3  # retries of a task killed for memory (Ray's default: forever); local Ray only
    # Custom Ray resources each engine actor asks for, e.g. {vlm_node: 1} to keep engines on the
    # nodes started with `ray start --resources='{"vlm_node": 4}'` (docs/cluster.md).
    engine_resources: dict[str, float] = field(default_factory=dict)
    # Local folders every node of a multi-node cluster mounts at the same path (NFS, Lustre):
    # a local root, data_root or curation input/output under one of them is accepted there.
    shared_paths: list[str] = field(default_factory=list)


@dataclass
class DetectorSpec:
    """The open-vocabulary detector that proposes evidence boxes (GroundingDINO)."""

    name: str = "grounding-dino-base"  # store folder: <store>/grounding/<name>/
    # Hugging Face id or local folder of an AutoModelForZeroShotObjectDetection checkpoint;
    # `builtin:tiny-grounding-dino` is a random-weight model built locally (tests, smoke runs).
    model_id: str = "IDEA-Research/grounding-dino-base"
    revision: str | None = None
    dtype: str = "float32"  # on GPU; always float32 on CPU
    # Processor resize override, e.g. {shortest_edge: 800, longest_edge: 1333}; null: the checkpoint's.
    image_size: dict | None = None
    batch_size: int = 16  # (image, phrase) queries per forward pass
    box_threshold: float = 0.30
    text_threshold: float = 0.25
    nms_iou: float = 0.5
    max_boxes: int = 32  # per query
    # GPUs per detector replica; null: one if the Ray cluster has GPUs, else run on CPU.
    gpus: float | None = None
    replicas: int = 1  # actor-pool size


@dataclass
class SelectSpec:
    """Which items get masked views (views multiply model work by up to five)."""

    mode: str = "all"  # all | sample (seeded fraction or count) | below (target score under a threshold)
    fraction: float | None = None  # sample: each item kept with this probability (stable per item)
    count: int | None = None  # sample: exactly this many items (or all, if fewer)
    metric: str | None = None  # below: the metric to read; null: the sweep's target
    threshold: float = 0.5  # below: items scoring strictly below it


@dataclass
class EvidenceSpec:
    """Grounding, matched control boxes, masked views and their answer deltas (SPEC section 3).

    Grounding also runs when the grounding_only metric is requested; views and deltas only
    when enabled.
    """

    enabled: bool = False
    question_set: str = "claims"  # whose questions/claims are grounded and viewed
    detector: DetectorSpec = field(default_factory=DetectorSpec)
    fill: str = "blur"  # blur | mean: how masked pixels are filled
    blur_sigma: float = 0.1  # blur: sigma as a fraction of the image's shorter side
    area_tolerance: float = 0.15  # control box area within +-15% of the evidence box's
    aspect_tolerance: float = 0.20  # control box aspect ratio within +-20%
    max_control_iou: float = 0.10  # IoU of a control box with any evidence box of the image
    max_attempts: int = 200
    select: SelectSpec = field(default_factory=SelectSpec)
    seed: int = 0  # control boxes and sampling
    view_workers: int = 1  # actor-pool size of the view renderer


@dataclass
class JudgeSpec:
    """VLM-as-judge: each backbone grades each (image, caption) by generation.

    Requesting a judge_* metric runs its kind even when enabled is false.
    """

    enabled: bool = False
    kinds: list[str] = field(default_factory=lambda: ["holistic", "decomposed"])
    max_new_tokens: int | None = None  # null: the backbone's max_new_tokens


@dataclass
class LeaseSpec:
    """The lock a run takes on its output folder (pipeline/store/lease.py): one writer at a time."""

    ttl_s: float = 600.0  # a killed run's lease blocks the output for at most this long
    force: bool = False  # take over a lease that has not expired (the holder is known dead)


@dataclass
class SweepConfig:
    name: str = "???"
    backbones: list[str] = field(default_factory=list)
    benchmarks: list[str] = field(default_factory=list)
    metrics: list[str] = field(
        default_factory=lambda: [
            "depict",
            "agree",
            "agree_unweighted",
            "agree_unweighted+vqascore",
            "soft_tifa_am",
            "soft_tifa_gm",
            "soft_tifa_am+vqascore",
            "hard_fixed_yes",
            "dsg",
            "dsg_nodep",
            "vqascore",
            "vqascore_raw",
            "mean_commitment",
        ]
    )
    target: str = "depict"  # the metric compared against the strongest baseline
    baselines: list[str] = field(default_factory=lambda: ["dsg", "soft_tifa_am", "vqascore"])
    lam: float = 0.5  # weight of the holistic term in every merge
    probability: str = "normalized"  # normalized: sigmoid(lp_yes - lp_no) | raw: exp(lp_yes)
    questions: QuestionsSpec = field(default_factory=QuestionsSpec)
    prompts: str = "v1"
    bootstrap: BootstrapSpec = field(default_factory=BootstrapSpec)
    root: str = "outputs"  # local folder or s3:// prefix
    store: str = "${root}/store"  # the shared answer cache
    data_root: str = "${root}/datasets"  # benchmark files live under here by default
    run_name: str = "${name}"
    compute: ComputeSpec = field(default_factory=ComputeSpec)
    # Per-name partial overrides, e.g. backbone_overrides.qwen3_5-27b.tensor_parallel_size=4
    backbone_overrides: dict = field(default_factory=dict)
    benchmark_overrides: dict = field(default_factory=dict)
    evidence: EvidenceSpec = field(default_factory=EvidenceSpec)
    judge: JudgeSpec = field(default_factory=JudgeSpec)
    lease: LeaseSpec = field(default_factory=LeaseSpec)
    # Items per scoring window (null: one window): requests -> answers -> scores run a window at a
    # time, so the driver holds one window's requests and answers, never the whole sweep's.
    window_items: int | None = 50_000


@dataclass
class PromptSet:
    """Versioned prompt templates (conf/prompts/<version>.yaml)."""

    version: str
    templates: dict[str, str]

    def template(self, kind: str) -> str:
        try:
            return self.templates[kind]
        except KeyError:
            raise ConfigError(f"prompts.{kind}", f"prompt version {self.version!r} has no template {kind!r}") from None

    def prompt_id(self, kind: str) -> str:
        """Version plus a hash of the exact template text: editing a template changes every key."""
        from operators.hashing import digest

        return f"{self.version}:{digest(self.template(kind).encode())[:12]}"


@dataclass
class ResolvedConfig:
    sweep: SweepConfig
    backbones: dict[str, BackboneSpec]
    benchmarks: dict[str, BenchmarkSpec]
    prompts: PromptSet

    @property
    def run_dir(self) -> str:
        return join_url(self.sweep.root, "runs", self.sweep.run_name)

    def to_dict(self) -> dict:
        """Plain, fully resolved view (for manifests)."""
        return {
            "sweep": OmegaConf.to_container(OmegaConf.structured(self.sweep), resolve=True),
            "backbones": {k: OmegaConf.to_container(OmegaConf.structured(v)) for k, v in self.backbones.items()},
            "benchmarks": {k: OmegaConf.to_container(OmegaConf.structured(v)) for k, v in self.benchmarks.items()},
            "prompts": {"version": self.prompts.version, "templates": dict(self.prompts.templates)},
        }


def _absolute(path: str) -> str:
    """Local paths become absolute (Ray workers and job submission change directories)."""
    if "://" in path:
        return path
    return str(Path(os.path.expanduser(path)).resolve())


def conf_dirs(conf_dir: Path | str | None = None) -> list[Path]:
    """Where configs are looked up, first match wins: `conf_dir` alone when given (a test's
    own folder), else the folders named in $DEPICT_CONF, then the shipped configs."""
    if conf_dir:
        return [Path(conf_dir)]
    extra = [Path(p).expanduser().resolve() for p in os.environ.get(CONF_ENV, "").split(os.pathsep) if p.strip()]
    for folder in extra:
        if not folder.is_dir():
            raise ConfigError(CONF_ENV, f"no folder {folder} (${CONF_ENV} names folders of your own configs)")
    return [*extra, CONF_DIR]


def _read_conf(dirs: Sequence[Path], kind: str, name: str, key: str) -> DictConfig:
    """`<kind>/<name>.yaml` from the first folder that has it (a user's file shadows a shipped one)."""
    for folder in dirs:
        path = folder / kind / f"{name}.yaml"
        if path.exists():
            return _read_yaml(path, key)
    choices = sorted({p.stem for folder in dirs for p in (folder / kind).glob("*.yaml")})
    tried = " or ".join(str(folder / kind / f"{name}.yaml") for folder in dirs)
    raise ConfigError(key, f"no file {tried} (available: {', '.join(choices) or 'none'})")


def _read_yaml(path: Path, key: str) -> DictConfig:
    try:
        cfg = OmegaConf.load(path)
    except Exception as exc:  # yaml errors carry line numbers; keep them
        raise ConfigError(key, f"cannot parse {path}: {exc}") from exc
    if not isinstance(cfg, DictConfig):
        raise ConfigError(key, f"{path} must hold a mapping")
    return cfg


def _structured(schema_cls, *layers, key: str):
    """Merge YAML layers onto a structured schema; type errors become ConfigErrors."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema_cls), *layers)
        return merged
    except OmegaConfBaseException as exc:
        full_key = getattr(exc, "full_key", None)
        where = f"{key}.{full_key}" if full_key else key
        raise ConfigError(where, str(exc).splitlines()[0]) from exc


def _to_object(cfg: DictConfig, key: str):
    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        full_key = getattr(exc, "full_key", None)
        where = f"{key}.{full_key}" if full_key else key
        raise ConfigError(where, str(exc).splitlines()[0]) from exc


# What `python jobs/sweep.py` runs with no sweep=: the demo scored by the trained micro model.
DEFAULT_SWEEP = "demo"


def parse_overrides(args: Sequence[str], preset_key: str = "sweep") -> tuple[str, DictConfig]:
    """Split `<preset_key>=<preset>` from the other `key=value` overrides (OmegaConf dotlist syntax)."""
    preset = DEFAULT_SWEEP if preset_key == "sweep" else "default"
    rest = []
    for arg in args:
        if "=" not in arg:
            raise ConfigError(arg, "arguments are written key=value (e.g. backbones=[smoke]), got a bare word")
        key, value = arg.split("=", 1)
        if key == preset_key:
            preset = value
        else:
            rest.append(arg)
    for arg in rest:  # one at a time, so that a malformed value is named with its key
        try:
            OmegaConf.from_dotlist([arg])
        except Exception as exc:  # YAML parser errors are not OmegaConf's
            key, _, value = arg.partition("=")
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(key, f"cannot parse the value {value!r} ({problem})") from None
    try:
        return preset, OmegaConf.from_dotlist(rest)
    except OmegaConfBaseException as exc:
        raise ConfigError(str(rest), str(exc).splitlines()[0]) from exc


def load_config(
    args: Sequence[str] = (),
    conf_dir: Path | str | None = None,
    overrides: dict | None = None,
    *,
    schema: type = SweepConfig,
    preset_key: str = "sweep",
) -> ResolvedConfig:
    """Resolve `sweep=<preset> key=value ...` into a validated ResolvedConfig.

    `overrides` (a nested dict, applied last) is the programmatic twin of the command line.
    Other jobs reuse this with their own schema (a SweepConfig subclass) and preset folder,
    e.g. curation: `schema=CurationConfig, preset_key="curation"` reads conf/curation/.
    Files are looked up in $DEPICT_CONF's folders, then the shipped conf/ (`conf_dirs`).
    """
    conf = conf_dirs(conf_dir)
    preset, cli = parse_overrides(args, preset_key=preset_key)
    preset_cfg = _read_conf(conf, preset_key, preset, preset_key)
    layers = [preset_cfg, cli] + ([OmegaConf.create(overrides)] if overrides else [])
    merged = _structured(schema, *layers, key=preset_key)
    sweep: SweepConfig = _to_object(merged, preset_key)
    sweep.root = _absolute(sweep.root)
    sweep.store = _absolute(sweep.store)
    sweep.data_root = _absolute(sweep.data_root)

    backbone_names = list(dict.fromkeys(sweep.backbones))
    if sweep.questions.source == "model" and not sweep.questions.per_backbone:
        backbone_names += [sweep.questions.generator]
    backbones = {}
    for i, name in enumerate(dict.fromkeys(backbone_names)):
        key = f"backbones[{i}]" if name in sweep.backbones else "questions.generator"
        layers = [_read_conf(conf, "backbones", name, key)]
        if name in sweep.backbone_overrides:
            layers.append(OmegaConf.create(sweep.backbone_overrides[name]))
        spec: BackboneSpec = _to_object(_structured(BackboneSpec, *layers, key=f"backbone {name}"), f"backbone {name}")
        backbones[name] = spec

    benchmarks = {}
    for i, name in enumerate(dict.fromkeys(sweep.benchmarks)):
        raw = _read_conf(conf, "benchmarks", name, f"benchmarks[{i}]")
        layers = [raw]
        if name in sweep.benchmark_overrides:
            layers.append(OmegaConf.create(sweep.benchmark_overrides[name]))
        # Benchmark files may interpolate ${data_root} and ${root}.
        holder = OmegaConf.create({"data_root": sweep.data_root, "root": sweep.root, "bench": OmegaConf.merge(*layers)})
        try:
            resolved = OmegaConf.to_container(holder, resolve=True)["bench"]
        except OmegaConfBaseException as exc:
            raise ConfigError(f"benchmark {name}", str(exc).splitlines()[0]) from exc
        spec: BenchmarkSpec = _to_object(
            _structured(BenchmarkSpec, OmegaConf.create(resolved), key=f"benchmark {name}"), f"benchmark {name}"
        )
        spec.root = _absolute(spec.root)
        benchmarks[name] = spec

    for kind, overrides, names in (("backbone", sweep.backbone_overrides, backbones), ("benchmark", sweep.benchmark_overrides, benchmarks)):
        for name in sorted(set(overrides) - set(names)):  # a typo, or a name another run uses: say so
            log.warning("%s_overrides.%s: no %s of this run is named %s (this run's: %s); ignored",
                        kind, name, kind, name, ", ".join(names) or "none")

    prompts_cfg = _read_conf(conf, "prompts", sweep.prompts, "prompts")
    templates = {k: v for k, v in OmegaConf.to_container(prompts_cfg).items() if k != "version"}
    prompts = PromptSet(version=str(prompts_cfg.get("version", sweep.prompts)), templates=templates)

    resolved = ResolvedConfig(sweep=sweep, backbones=backbones, benchmarks=benchmarks, prompts=prompts)
    validate(resolved, require_benchmarks=preset_key == "sweep")
    if preset_key == "sweep":  # the API checks when it is called without questions
        refuse_non_writers(resolved)
    return resolved


def check_benchmark_folders(cfg: ResolvedConfig) -> None:
    """Every benchmark's release folder exists (one listing each). The sweep calls this before
    any work; load_config does not, so configs can be built and inspected without the data."""
    from pipeline.benchmarks.io import missing_release_folder

    for name, bench in cfg.benchmarks.items():
        problem = missing_release_folder(bench.root, bench.loader)
        if problem:
            raise ConfigError(f"benchmark {name}.root", f"{problem} (set data_root=... or benchmark_overrides.{name}.root=...)")


def refuse_non_writers(cfg: ResolvedConfig) -> None:
    """A run that would ask a yes/no-only model (`writes_questions: false`) to write its
    questions fails here, naming the setting, instead of scoring every item `no_questions`."""
    q = cfg.sweep.questions
    if q.source != "model" or not required_question_sets(cfg.sweep):
        return
    writers = cfg.sweep.backbones if q.per_backbone else [q.generator]
    for name in writers:
        if not cfg.backbones[name].writes_questions:
            key = "questions.per_backbone" if q.per_backbone else "questions.generator"
            raise ConfigError(key, f"{name} answers yes/no questions but cannot write them; use questions.source=benchmark "
                                   "(a benchmark that ships its questions, as the demo does), give them yourself "
                                   "(Scorer(...)(..., questions=...)), or name a generator that writes them")


def validate(cfg: ResolvedConfig, require_benchmarks: bool = True) -> None:
    """Checks that need more than types: names, ranges, combinations."""
    s = cfg.sweep
    if not s.backbones:
        raise ConfigError("backbones", "no backbone selected")
    if require_benchmarks and not s.benchmarks:
        raise ConfigError("benchmarks", "no benchmark selected")
    validate_ranges(cfg)
    if not 0.0 <= s.lam <= 1.0:
        raise ConfigError("lam", f"must be in [0, 1], got {s.lam}")
    if s.probability not in PROBABILITIES:
        raise ConfigError("probability", f"must be one of {PROBABILITIES}, got {s.probability!r}")
    for i, metric in enumerate(s.metrics):
        if not is_known_metric(metric):
            raise ConfigError(f"metrics[{i}]", f"unknown metric {metric!r}")
    for key, metric in [("target", s.target), *((f"baselines[{i}]", m) for i, m in enumerate(s.baselines))]:
        if metric not in s.metrics:
            raise ConfigError(key, f"{metric!r} is not among the computed metrics")
    q = s.questions
    if q.source not in ("model", "benchmark"):
        raise ConfigError("questions.source", f"must be 'model' or 'benchmark', got {q.source!r}")
    for i, name in enumerate(q.sets):
        if name not in QUESTION_SETS:
            raise ConfigError(f"questions.sets[{i}]", f"unknown question set {name!r}; valid: {QUESTION_SETS}")
    for name, b in cfg.backbones.items():
        if b.engine not in ENGINES:
            raise ConfigError(f"backbone {name}.engine", f"must be one of {ENGINES}, got {b.engine!r}")
        if b.name != name:
            raise ConfigError(f"backbone {name}.name", f"file conf/backbones/{name}.yaml names itself {b.name!r}")
    for name, bench in cfg.benchmarks.items():
        if bench.loader not in LOADERS:
            raise ConfigError(f"benchmark {name}.loader", f"unknown loader {bench.loader!r}; valid: {LOADERS}")
        p = bench.protocol
        for i, breakdown in enumerate(p.breakdowns):
            if breakdown not in BREAKDOWNS:
                raise ConfigError(f"benchmark {name}.protocol.breakdowns[{i}]", f"unknown breakdown {breakdown!r}; valid: {BREAKDOWNS}")
        if p.kind not in PROTOCOL_STATISTICS:
            raise ConfigError(f"benchmark {name}.protocol.kind", f"must be one of {tuple(PROTOCOL_STATISTICS)}")
        if p.no_questions not in NO_QUESTION_POLICIES:
            raise ConfigError(f"benchmark {name}.protocol.no_questions", f"must be one of {NO_QUESTION_POLICIES}, got {p.no_questions!r}")
        allowed = PROTOCOL_STATISTICS[p.kind]
        for i, stat in enumerate(p.statistics):
            if stat not in allowed:
                raise ConfigError(f"benchmark {name}.protocol.statistics[{i}]", f"{stat!r} is not one of {allowed}")
        if p.primary_statistic not in allowed:
            raise ConfigError(f"benchmark {name}.protocol.primary_statistic", f"{p.primary_statistic!r} is not one of {allowed}")
        if p.tie_policy not in TIE_POLICIES:
            raise ConfigError(f"benchmark {name}.protocol.tie_policy", f"must be one of {TIE_POLICIES}")
    needed_templates = ["answer_image", "answer_caption", "holistic"]
    if q.source == "model":
        needed_templates += [f"generate_{'questions' if s_ == 'depict' else s_}" for s_ in required_question_sets(s)]
    validate_evidence(s)
    validate_judge(s)
    needed_templates += [f"judge_{kind}" for kind in judge_kinds(s)]
    if "claims" in required_question_sets(s):
        needed_templates.append("claim")
    for kind in needed_templates:
        cfg.prompts.template(kind)


def validate_cluster_settings(c: ComputeSpec) -> None:
    """compute.engine_resources amounts are positive numbers; compute.shared_paths are
    absolute local folders (an s3:// root is shared by every node anyway)."""
    for name, amount in c.engine_resources.items():
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not amount > 0:
            raise ConfigError(f"compute.engine_resources.{name}", f"must be a number > 0, got {amount!r}")
    for path in c.shared_paths:
        if not isinstance(path, str) or "://" in path or not os.path.isabs(os.path.expanduser(path)):
            raise ConfigError("compute.shared_paths", f"must list absolute local folders (mounts every node sees), got {path!r}")


def _at_least(key: str, value, low, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if value is None or not math.isfinite(value) or value < low:
        raise ConfigError(key, f"must be at least {low}{' (or null)' if optional else ''}, got {value}")


def _within(key: str, value, low, high, *, low_open: bool = False, high_open: bool = False, optional: bool = False) -> None:
    if value is None and optional:
        return
    below = value is None or not math.isfinite(value) or (value <= low if low_open else value < low)
    above = value is not None and (value >= high if high_open else value > high)
    if below or above:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ConfigError(key, f"must be in {interval}{' (or null)' if optional else ''}, got {value}")


def _names(key: str, values: list, *, allow_empty: bool = False) -> None:
    if not values and not allow_empty:
        raise ConfigError(key, "must not be empty")
    for i, value in enumerate(values):
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{key}[{i}]", f"must be a non-empty name, got {value!r}")
        if "/" in value or value in (".", ".."):
            raise ConfigError(f"{key}[{i}]", f"must be a plain name, got {value!r}")


def validate_ranges(cfg: ResolvedConfig) -> None:
    """Every number and list has a range, checked before any work: a value outside it would
    otherwise surface after the model work (n_resamples=-5), or never (limit_groups=-1
    silently dropped the last group, batch_size=0 failed every request, n_resamples=0 nulled
    every interval)."""
    s = cfg.sweep
    _names("backbones", list(s.backbones))
    _names("metrics", list(s.metrics))
    if not s.run_name or "/" in s.run_name or s.run_name in (".", "..") or not s.run_name.strip():
        raise ConfigError("run_name", f"must be a plain folder name (no '/'), got {s.run_name!r}")
    _at_least("questions.max_questions", s.questions.max_questions, 1)
    _at_least("bootstrap.n_resamples", s.bootstrap.n_resamples, MIN_RESAMPLES)
    _at_least("bootstrap.seed", s.bootstrap.seed, 0)
    _at_least("window_items", s.window_items, 1, optional=True)
    _within("bootstrap.confidence", s.bootstrap.confidence, 0, 1, low_open=True, high_open=True)
    c = s.compute
    _at_least("compute.num_cpus", c.num_cpus, 1, optional=True)
    _at_least("compute.engines_per_backbone", c.engines_per_backbone, 1)
    _at_least("compute.gpus_per_engine", c.gpus_per_engine, 0, optional=True)
    _within("compute.cpus_per_engine", c.cpus_per_engine, 0, math.inf, low_open=True, high_open=True)
    _at_least("compute.threads_per_engine", c.threads_per_engine, 0, optional=True)
    _at_least("compute.rows_per_part", c.rows_per_part, 1)
    _at_least("compute.rows_per_batch", c.rows_per_batch, 1)
    _within("compute.engine_memory_gb", c.engine_memory_gb, 0, math.inf, low_open=True, high_open=True, optional=True)
    _within("compute.data_object_store_fraction", c.data_object_store_fraction, 0, 1, low_open=True)
    _within("compute.task_memory_gb", c.task_memory_gb, 0, math.inf, low_open=True, high_open=True)
    _within("compute.object_store_memory_gb", c.object_store_memory_gb, 0, math.inf, low_open=True, high_open=True, optional=True)
    _at_least("compute.oom_retries", c.oom_retries, 0)
    validate_cluster_settings(c)
    _within("lease.ttl_s", s.lease.ttl_s, 0, math.inf, low_open=True, high_open=True)
    for name, b in cfg.backbones.items():
        key = f"backbone {name}"
        _at_least(f"{key}.tensor_parallel_size", b.tensor_parallel_size, 1)
        _at_least(f"{key}.min_image_pixels", b.min_image_pixels, 1)
        _at_least(f"{key}.max_image_pixels", b.max_image_pixels, b.min_image_pixels)
        _at_least(f"{key}.max_model_len", b.max_model_len, 1)
        _within(f"{key}.gpu_memory_utilization", b.gpu_memory_utilization, 0, 1, low_open=True)
        _at_least(f"{key}.batch_size", b.batch_size, 1)
        _at_least(f"{key}.max_new_tokens", b.max_new_tokens, 1)
        _at_least(f"{key}.max_prompt_tokens", b.max_prompt_tokens, 1, optional=True)
        if not b.yes_spellings or not b.no_spellings:
            raise ConfigError(key, "yes_spellings and no_spellings must be non-empty")
        reuse = (b.engine_options or {}).get("prefix_reuse", True)
        if not isinstance(reuse, bool):  # bool("off") is True: a string would leave reuse on, unnoticed
            raise ConfigError(f"{key}.engine_options.prefix_reuse", f"must be true or false, got {reuse!r}")
        for field_name in ("yes_spellings", "no_spellings"):
            for i, spelling in enumerate(getattr(b, field_name)):
                if not isinstance(spelling, str) or not spelling:
                    raise ConfigError(f"{key}.{field_name}[{i}]", f"must be a non-empty string, got {spelling!r}")
    for name, bench in cfg.benchmarks.items():
        _at_least(f"benchmark {name}.limit_groups", bench.limit_groups, 1, optional=True)
        if not bench.protocol.statistics:
            raise ConfigError(f"benchmark {name}.protocol.statistics", "must not be empty")
    e = s.evidence
    _at_least("evidence.seed", e.seed, 0)
    if e.select.threshold is None or not math.isfinite(e.select.threshold):
        raise ConfigError("evidence.select.threshold", f"must be a finite number, got {e.select.threshold}")
    for side, value in (e.detector.image_size or {}).items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"evidence.detector.image_size.{side}", f"must be a positive number of pixels, got {value!r}")


def validate_evidence(s: SweepConfig) -> None:
    e, d = s.evidence, s.evidence.detector
    if e.question_set not in QUESTION_SETS:
        raise ConfigError("evidence.question_set", f"unknown question set {e.question_set!r}; valid: {QUESTION_SETS}")
    if e.fill not in FILLS:
        raise ConfigError("evidence.fill", f"must be one of {FILLS}, got {e.fill!r}")
    for key, value in [("detector.box_threshold", d.box_threshold), ("detector.text_threshold", d.text_threshold), ("detector.nms_iou", d.nms_iou), ("max_control_iou", e.max_control_iou)]:
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"evidence.{key}", f"must be in [0, 1], got {value}")
    for key, value in [("area_tolerance", e.area_tolerance), ("aspect_tolerance", e.aspect_tolerance)]:
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"evidence.{key}", f"must be in [0, 1), got {value}")
    if e.blur_sigma <= 0:
        raise ConfigError("evidence.blur_sigma", f"must be positive, got {e.blur_sigma}")
    for key, value in [("detector.max_boxes", d.max_boxes), ("detector.batch_size", d.batch_size), ("detector.replicas", d.replicas), ("max_attempts", e.max_attempts), ("view_workers", e.view_workers)]:
        if value < 1:
            raise ConfigError(f"evidence.{key}", f"must be at least 1, got {value}")
    if d.gpus is not None and d.gpus < 0:
        raise ConfigError("evidence.detector.gpus", f"must be >= 0, got {d.gpus}")
    sel = e.select
    if sel.mode not in SELECT_MODES:
        raise ConfigError("evidence.select.mode", f"must be one of {SELECT_MODES}, got {sel.mode!r}")
    if sel.mode == "sample":
        if (sel.fraction is None) == (sel.count is None):
            raise ConfigError("evidence.select", "mode 'sample' needs exactly one of fraction or count")
        if sel.fraction is not None and not 0.0 < sel.fraction <= 1.0:
            raise ConfigError("evidence.select.fraction", f"must be in (0, 1], got {sel.fraction}")
        if sel.count is not None and sel.count < 1:
            raise ConfigError("evidence.select.count", f"must be at least 1, got {sel.count}")
    if sel.mode == "below":
        metric = sel.metric or s.target
        if metric not in s.metrics or not is_answer_metric(metric):
            raise ConfigError("evidence.select.metric", f"{metric!r} must be one of the computed answer-based metrics (not grounding or judge metrics)")


def validate_judge(s: SweepConfig) -> None:
    for i, kind in enumerate(s.judge.kinds):
        if kind not in JUDGE_KINDS:
            raise ConfigError(f"judge.kinds[{i}]", f"unknown judge kind {kind!r}; valid: {JUDGE_KINDS}")
    if s.judge.max_new_tokens is not None and s.judge.max_new_tokens < 1:
        raise ConfigError("judge.max_new_tokens", "must be at least 1")


def is_answer_metric(metric: str) -> bool:
    """Computed from yes/no answers by the scores stage (not by the grounding or judge stages)."""
    base = metric.split("+", 1)[0]
    return base not in GROUNDING_METRICS and base not in JUDGE_METRICS


def judge_kinds(sweep: SweepConfig) -> list[str]:
    """Judge kinds the run generates: the configured ones when enabled, plus those its metrics need."""
    kinds = list(sweep.judge.kinds) if sweep.judge.enabled else []
    for metric in sweep.metrics:
        kind = JUDGE_METRICS.get(metric)
        if kind and kind not in kinds:
            kinds.append(kind)
    return kinds


def needs_grounding(sweep: SweepConfig) -> bool:
    return sweep.evidence.enabled or any(m.split("+", 1)[0] in GROUNDING_METRICS for m in sweep.metrics)


def required_question_sets(sweep: SweepConfig) -> list[str]:
    """Question sets the run needs: the configured ones plus those its metrics need."""
    sets = list(sweep.questions.sets)
    for metric in sweep.metrics:
        qs = metric_question_set(metric)
        if qs and qs not in sets:
            sets.append(qs)
    if sweep.evidence.enabled and sweep.evidence.question_set not in sets:
        sets.append(sweep.evidence.question_set)
    return sets


def as_plain(value):
    """OmegaConf containers -> plain Python (for manifests and messages)."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value
