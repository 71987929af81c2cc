import pytest

from pipeline.config import ConfigError, is_known_metric, load_config, required_question_sets


def test_smoke_preset_resolves_with_absolute_paths(tmp_path):
    cfg = load_config([f"root={tmp_path}"])
    assert cfg.sweep.name == "smoke"
    assert cfg.sweep.backbones == ["smoke"]
    assert cfg.backbones["smoke"].engine == "hf"
    assert cfg.sweep.store == f"{tmp_path}/store"
    assert cfg.run_dir == f"{tmp_path}/runs/smoke"


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
        [f"root={tmp_path}", "lam=0.3", "compute.engines_per_backbone=3", "backbone_overrides.smoke.batch_size=4"]
    )
    assert cfg.sweep.lam == 0.3
    assert cfg.sweep.compute.engines_per_backbone == 3
    assert cfg.backbones["smoke"].batch_size == 4


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
        ("backbone_overrides.smoke.engine=tpu", "backbone smoke.engine"),
        ("backbone_overrides.smoke.batch_size=many", "backbone smoke.batch_size"),
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
    assert is_known_metric("depict")
    assert is_known_metric("soft_tifa_am+vqascore")
    assert not is_known_metric("vqascore+vqascore")
    assert not is_known_metric("soft_tifa_am+dsg")


def test_required_question_sets_follow_metrics():
    cfg = load_config(["metrics=[depict,claim_mean_am,vqascore]", "baselines=[vqascore]", "questions.sets=[]"])
    assert required_question_sets(cfg.sweep) == ["depict", "claims"]


def test_prompt_ids_change_with_template_text(tmp_path):
    cfg = load_config([])
    prompts = cfg.prompts
    before = prompts.prompt_id("answer_image")
    prompts.templates["answer_image"] += " "
    assert prompts.prompt_id("answer_image") != before
    assert before.startswith("v1:")
