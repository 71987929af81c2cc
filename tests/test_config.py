import pytest

from operators.metrics import catalog
from pipeline.config import ConfigError, load_config


def test_default_preset_is_the_demo_on_the_trained_micro_model_with_absolute_paths(tmp_path):
    cfg = load_config([f"root={tmp_path}"])
    assert cfg.sweep.name == "demo"
    assert cfg.sweep.backbones == ["micro", "oracle"] and cfg.backbones["oracle"].engine == "world_oracle"
    assert list(cfg.benchmarks) == ["demo_large", "demo_large_winoground", "demo_large_mcq"] and cfg.sweep.questions.open_share == 0.25
    assert cfg.backbones["micro"].model_id == "builtin:micro-vlm" and cfg.backbones["micro"].engine == "hf"
    assert cfg.sweep.store == f"{tmp_path}/store"
    assert cfg.run_dir == f"{tmp_path}/runs/demo"


def test_smoke_preset_is_the_small_demo_on_the_random_weight_model(tmp_path):
    demo, smoke = load_config([f"root={tmp_path}"]), load_config([f"root={tmp_path}", "sweep=smoke"])
    assert smoke.sweep.name == "smoke" and smoke.sweep.backbones == ["smoke"]
    assert smoke.backbones["smoke"].model_id == "builtin:tiny-vlm"
    assert smoke.sweep.benchmarks == ["demo", "demo_winoground", "demo_mcq"]  # the default's fixed items, three parts
    assert smoke.sweep.questions.source == "benchmark" and smoke.sweep.questions.open_share == 0
    # the default has the shipped writer write its questions, loaded beside the backbones
    assert demo.sweep.questions.source == "model" and demo.sweep.questions.generator == "micro-writer"
    assert demo.backbones["micro-writer"].model_id == "builtin:micro-writer" and demo.backbones["micro-writer"].writes_questions
    shipped = load_config([f"root={tmp_path}", "questions.source=benchmark"])  # the questions the demo ships instead
    assert "micro-writer" not in shipped.backbones


def test_paper_preset_names_eleven_backbones_and_five_benchmarks():
    cfg = load_config(["sweep=paper", "root=s3://bucket/depict"])
    assert len(cfg.sweep.backbones) == 11
    assert set(cfg.sweep.benchmarks) == {"genai_bench", "tifa160", "richhf", "winoground", "negbench"}
    # the fixed generator is loaded too
    assert "qwen3_5-27b" in cfg.backbones
    assert cfg.benchmarks["genai_bench"].root.startswith("s3://bucket/depict/")
    assert cfg.backbones["qwen3_5-27b"].tensor_parallel_size == 2


def test_every_backbone_file_loads():
    from pipeline.config import CONF_DIR

    names = sorted(p.stem for p in (CONF_DIR / "backbones").glob("*.yaml"))
    assert len(names) >= 13
    cfg = load_config([f"backbones=[{','.join(names)}]", "questions.source=benchmark"])
    for name in names:
        assert cfg.backbones[name].name == name
        assert len(cfg.backbones[name].fingerprint()) == 32


def test_cli_overrides_reach_nested_keys(tmp_path):
    cfg = load_config(
        [f"root={tmp_path}", "lam=0.3", "compute.engines_per_backbone=3", "backbone_overrides.micro.batch_size=4"]
    )
    assert cfg.sweep.lam == 0.3
    assert cfg.sweep.compute.engines_per_backbone == 3
    assert cfg.backbones["micro"].batch_size == 4


@pytest.mark.parametrize(
    "override, key",
    [
        ("backbones=[nope]", "backbones[0]"),
        ("benchmarks=[nope]", "benchmarks[0]"),
        ("lam=1.5", "lam"),
        ("lam=abc", "sweep.lam"),
        ("probability=log", "probability"),
        ("metrics=[depict,bogus]", "metrics[1]"),
        ("target=claim_mean_am", "target"),
        ("nonsense_key=1", "sweep.nonsense_key"),
        ("questions.sets=[depict,foo]", "questions.sets[1]"),
        ("backbone_overrides.micro.engine=tpu", "backbone micro.engine"),
        ("backbone_overrides.micro.batch_size=many", "backbone micro.batch_size"),
    ],
)
def test_bad_config_fails_naming_the_key(override, key):
    with pytest.raises(ConfigError) as info:
        load_config([override])
    assert info.value.key == key, str(info.value)


def test_unknown_preset_lists_the_available_ones():
    with pytest.raises(ConfigError, match="smoke"):
        load_config(["sweep=nope"])


def test_override_without_equals_sign_is_rejected():
    with pytest.raises(ConfigError):
        load_config(["backbones"])


def test_metric_ids():
    assert catalog.is_known("depict")
    assert catalog.is_known("soft_tifa_am+vqascore")
    assert not catalog.is_known("vqascore+vqascore")
    assert not catalog.is_known("soft_tifa_am+dsg")
    assert not catalog.is_known("mean_commitment+vqascore")  # a diagnostic, never merged: the run would not produce it


def test_required_question_sets_follow_metrics():
    cfg = load_config(["metrics=[depict,claim_mean_am,vqascore]", "baselines=[vqascore]", "questions.sets=[]"])
    assert cfg.sweep.required_question_sets() == ["depict", "claims"]


def test_prompt_ids_change_with_template_text(tmp_path):
    cfg = load_config([])
    prompts = cfg.prompts
    before = prompts.prompt_id("answer_image")
    prompts.templates["answer_image"] += " "
    assert prompts.prompt_id("answer_image") != before
    assert before.startswith("v1:")


# -- every number and list has a range, checked before any work ---------------------------------
# Unchecked, each of these would do harm: limit_groups=-1 silently drops the last group,
# batch_size=0 and max_image_pixels=0 fail every request with exit 0, n_resamples=0 nulls every
# interval and n_resamples=-5 fails only after all the model work. Each fails at load, naming its
# key, and nothing is computed (what is lost: nothing).
RANGE_CASES = [
    ("benchmark_overrides.demo_large.limit_groups=-1", "benchmark demo_large.limit_groups"),
    ("benchmark_overrides.demo_large.limit_groups=0", "benchmark demo_large.limit_groups"),
    ("backbone_overrides.micro.batch_size=0", "backbone micro.batch_size"),
    ("backbone_overrides.micro.max_image_pixels=0", "backbone micro.max_image_pixels"),
    ("backbone_overrides.micro.min_image_pixels=0", "backbone micro.min_image_pixels"),
    ("backbone_overrides.micro.max_image_pixels=1000", "backbone micro.max_image_pixels"),  # below min_image_pixels
    ("backbone_overrides.micro.max_model_len=0", "backbone micro.max_model_len"),
    ("backbone_overrides.micro.max_new_tokens=0", "backbone micro.max_new_tokens"),
    ("backbone_overrides.micro.max_prompt_tokens=0", "backbone micro.max_prompt_tokens"),
    ("backbone_overrides.micro.gpu_memory_utilization=1.5", "backbone micro.gpu_memory_utilization"),
    ("backbone_overrides.micro.tensor_parallel_size=0", "backbone micro.tensor_parallel_size"),
    ("backbone_overrides.micro.yes_spellings=[Yes,'']", "backbone micro.yes_spellings[1]"),
    # a string left reuse on whatever it said (bool("off") is True)
    ("backbone_overrides.micro.engine_options={prefix_reuse: 'off'}", "backbone micro.engine_options.prefix_reuse"),
    ("backbone_overrides.micro.engine_options={batch_invariant: 'no'}", "backbone micro.engine_options.batch_invariant"),
    ("bootstrap.n_resamples=0", "bootstrap.n_resamples"),
    ("bootstrap.n_resamples=-5", "bootstrap.n_resamples"),
    ("bootstrap.seed=-1", "bootstrap.seed"),
    ("bootstrap.confidence=1", "bootstrap.confidence"),
    ("compute.cpus_per_engine=-1", "compute.cpus_per_engine"),
    ("compute.cpus_per_engine=0", "compute.cpus_per_engine"),
    ("compute.gpus_per_engine=-1", "compute.gpus_per_engine"),
    ("compute.num_cpus=0", "compute.num_cpus"),
    ("compute.engines_per_backbone=0", "compute.engines_per_backbone"),
    ("compute.rows_per_part=0", "compute.rows_per_part"),
    ("compute.rows_per_batch=0", "compute.rows_per_batch"),
    ("compute.engine_memory_gb=0", "compute.engine_memory_gb"),
    ("compute.engine_resources={vlm_node: 0}", "compute.engine_resources.vlm_node"),
    ("compute.shared_paths=[relative/dir]", "compute.shared_paths"),
    ("compute.shared_paths=[s3://bucket/x]", "compute.shared_paths"),
    ("questions.max_questions=0", "questions.max_questions"),
    ("lam=-0.1", "lam"),
    ("lam=nan", "lam"),
    ("backbones=[]", "backbones"),
    ("metrics=[]", "metrics"),
    ("run_name=../other", "run_name"),
    ("lease.ttl_s=0", "lease.ttl_s"),
    ("benchmark_overrides.demo_large.protocol.breakdowns=[skills]", "benchmark demo_large.protocol.breakdowns[0]"),
    ("benchmark_overrides.demo_large.protocol.statistics=[]", "benchmark demo_large.protocol.statistics"),
    ("benchmark_overrides.demo_large.loader=nope", "benchmark demo_large.loader"),
    ("benchmark_overrides.demo_large.protocol.no_questions=drop", "benchmark demo_large.protocol.no_questions"),
    ("evidence.seed=-1", "evidence.seed"),
    ("evidence.detector.batch_size=0", "evidence.detector.batch_size"),
    ("evidence.detector.box_threshold=1.2", "evidence.detector.box_threshold"),
    ("evidence.detector.image_size={shortest_edge: 0}", "evidence.detector.image_size.shortest_edge"),
    ("evidence.select.threshold=nan", "evidence.select.threshold"),
    ("judge.max_new_tokens=0", "judge.max_new_tokens"),
]


@pytest.mark.parametrize(("override", "key"), RANGE_CASES)
def test_out_of_range_values_fail_at_load_naming_the_key(override, key, tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config([f"root={tmp_path}", override])
    assert info.value.key == key, str(info.value)
    assert "\n" not in str(info.value)


def test_boundary_values_are_accepted(tmp_path):
    cfg = load_config([
        f"root={tmp_path}", "benchmark_overrides.demo_large.limit_groups=1", "bootstrap.n_resamples=10", "lam=0", "compute.gpus_per_engine=0",
        "compute.cpus_per_engine=0.5", "backbone_overrides.micro.gpu_memory_utilization=1.0", "benchmark_overrides.demo_large.limit_groups=null",
    ])  # fmt: skip
    assert cfg.benchmarks["demo_large"].limit_groups is None and cfg.sweep.bootstrap.n_resamples == 10


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["curation=smoke", "inputs=[/x]", "top_fraction=0"], "top_fraction"),
        (["curation=smoke", "inputs=[/x]", "min_score=nan"], "min_score"),
        (["curation=smoke", "inputs=[/x]", "compute.cpus_per_engine=-1"], "compute.cpus_per_engine"),
        (["curation=smoke", "inputs=[/x]", "lease.ttl_s=-1"], "lease.ttl_s"),
        (["curation=smoke", "inputs=[]"], "inputs"),
    ],
)
def test_curation_ranges(args, key, tmp_path):
    from pipeline.curation.curation_config import load_curation_config

    with pytest.raises(ConfigError) as info:
        load_curation_config([f"root={tmp_path}", *args])
    assert info.value.key == key, str(info.value)


def test_malformed_override_names_its_key_in_one_line():
    with pytest.raises(ConfigError) as info:
        load_config(["backbones=[smoke"])
    assert info.value.key == "backbones" and "[smoke" in str(info.value) and "\n" not in str(info.value)


# -- every job: one line on stderr, exit code 2, never a traceback -------------------------------


def _job(name: str):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(f"{name}_job", Path(__file__).resolve().parent.parent / "jobs" / f"{name}.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


@pytest.mark.parametrize(
    ("job", "args", "says"),
    [
        ("sweep", ["backbones=[smoke"], "'backbones'"),
        ("sweep", ["bootstrap.n_resamples=-5"], "'bootstrap.n_resamples'"),
        ("sweep", ["benchmark_overrides.demo_large.limit_groups=-1"], "limit_groups"),
        ("sweep", ["benchmark_overrides.demo_large.options.drawn=nope"], "'benchmark demo_large.options': demo: drawn must be true or false"),
        ("sweep", ["benchmarks=[tifa160]", "data_root={tmp}/missing"], "{tmp}/missing/tifa160 does not exist"),
        ("sweep", ["backbones"], "'backbones'"),
        ("curate", ["curation=smoke", "inputs=[/x"], "'inputs'"),
        ("curate", ["curation=smoke", "inputs=[{tmp}/missing.parquet]"], "{tmp}/missing.parquet: input shard not found"),
        ("curate", ["curation=smoke", "inputs=[/x]", "top_fraction=1.5"], "'top_fraction'"),
        ("tables", ["run={tmp}/missing"], "{tmp}/missing/manifest.json not found"),
        ("tables", ["run={tmp}", "n_resamples=-5"], "n_resamples"),
        ("metaeval", ["scores=[x", "human=h.csv"], "'scores'"),
        ("metaeval", ["scores={tmp}/missing.parquet", "human={tmp}/h.csv"], "missing.parquet"),
        ("metaeval", ["scores=s.parquet", "human=h.csv", "n_resamples=-5"], "'n_resamples'"),
        ("metaeval", ["scores=s.parquet", "human=h.csv", "kind=ranking"], "'kind'"),
    ],
)
def test_every_job_reports_bad_input_in_one_line_with_exit_code_2(job, args, says, tmp_path, capsys):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if job in ("sweep", "curate"):
        args.append(f"root={tmp_path}")
    code = _job(job).main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    if job != "tables" or "n_resamples" not in says:  # tables prints its usage line after the reason
        assert len(err.splitlines()) == 1, err
    assert says.replace("{tmp}", str(tmp_path)) in err and "Traceback" not in err


def test_a_yes_no_only_model_is_refused_as_question_writer(tmp_path):
    """builtin:micro-vlm answers yes/no but cannot write questions: naming it as the generator
    fails at load, naming the setting, instead of scoring every item `no_questions`."""
    with pytest.raises(ConfigError) as info:
        load_config([f"root={tmp_path}", "questions.source=model", "questions.generator=micro"])
    assert info.value.key == "questions.generator" and "cannot write them" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_config([f"root={tmp_path}", "questions.source=model", "questions.per_backbone=true"])
    assert info.value.key == "questions.per_backbone"
    load_config([f"root={tmp_path}", "questions.source=model", "metrics=[vqascore]", "target=vqascore", "baselines=[]", "questions.sets=[]",
                 "questions.generator=micro"])  # no question needed: nothing to refuse


def test_overrides_naming_nothing_in_the_run_are_reported(tmp_path, caplog):
    """An override for a benchmark or backbone the run does not have is reported, never dropped without a word."""
    with caplog.at_level("WARNING", logger="pipeline.config"):
        cfg = load_config([f"root={tmp_path}", "benchmark_overrides.demo.limit_groups=2", "backbone_overrides.micr.batch_size=8"])
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("benchmark_overrides.demo: no benchmark of this run is named demo (this run's: demo_large,") for m in said), said
    assert any(m.startswith("backbone_overrides.micr: no backbone of this run is named micr (this run's: micro, oracle, micro-writer)") for m in said), said
    assert "demo" not in cfg.benchmarks
    caplog.clear()
    with caplog.at_level("WARNING", logger="pipeline.config"):
        load_config([f"root={tmp_path}", "benchmark_overrides.demo_large.limit_groups=2"])
    assert caplog.records == []


def test_a_metric_error_names_what_would_be_valid():
    """A user who mistypes a metric, merges a term that is not mergeable, or drops a default
    baseline from metrics learns the fix from the one line (a wheel user has no catalog.py)."""
    with pytest.raises(ConfigError, match=r"unknown metric 'nope'; valid: depict, agree, .*soft_tifa_am\+vqascore"):
        load_config(["metrics=[nope]"])
    with pytest.raises(ConfigError, match=r"mean_commitment is not mergeable; mergeable: agree, "):
        load_config(["metrics=[mean_commitment+vqascore]"])
    with pytest.raises(ConfigError, match=r"^config error at 'baselines\[0\]': 'dsg' is not among the computed metrics "
                                         r"\(metrics: depict, vqascore\); add it to metrics or set baselines=\[\.\.\.\]"):
        load_config(["metrics=[depict,vqascore]"])
