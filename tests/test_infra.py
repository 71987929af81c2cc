"""Checks of the deployment files in infra/ that would otherwise fail only on a GPU cluster.

Every manifest is parsed, and the fields people get wrong are cross-checked against the
Dockerfile (image tag, Ray version), the repository (entry scripts, sweep presets), the
backbone configs (GPUs per engine) and the code that requests GPUs (`engine_pool`).
Each check is a function returning a list of problems, so the tests below also run it on
broken copies and make sure it complains.
"""
from __future__ import annotations

import copy
import itertools
import json
import math
import re
import shlex
from importlib.resources import files
from pathlib import Path

import jsonschema
import pytest
import tomllib
import yaml
from hypothesis import given
from hypothesis import strategies as st
from packaging.requirements import Requirement

from pipeline.config import ComputeSpec, load_config
from pipeline.stages.placement import engine_pool

ROOT = Path(__file__).resolve().parent.parent
INFRA = ROOT / "infra"
DOCKERFILE = INFRA / "Dockerfile"
RUNTIME_ENV = INFRA / "runtime_env.yaml"
RAY_UP = INFRA / "ray-up.yaml"
KUBERAY = INFRA / "kuberay"
MANIFESTS = sorted(INFRA.rglob("*.yaml"))

SECRET_NAMES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")

# GPUs per AWS instance type, for the `ray up` node types (add a row when you add a type).
INSTANCE_GPUS = {
    "m7i.2xlarge": 0,
    "m7i.4xlarge": 0,
    "m7i.8xlarge": 0,
    "g6e.xlarge": 1,
    "g6e.2xlarge": 1,
    "g6e.4xlarge": 1,
    "g6e.8xlarge": 1,
    "g6e.16xlarge": 1,
    "g6e.12xlarge": 4,
    "g6e.24xlarge": 4,
    "g6e.48xlarge": 8,
    "p4d.24xlarge": 8,
    "p4de.24xlarge": 8,
    "p5.48xlarge": 8,
    "p5e.48xlarge": 8,
    "p5en.48xlarge": 8,
}


# -- reading the files ------------------------------------------------------------------------


def load_docs(path: Path) -> list[dict]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, f"{path.relative_to(ROOT)} holds no YAML document"
    return docs


def parse_dockerfile(text: str) -> dict:
    """ARG defaults, ENV values, the resolved FROM image, LABELs, WORKDIR and COPY sources."""
    lines = re.sub(r"\\\n", " ", text).splitlines()
    args: dict[str, str] = {}
    out = {"args": args, "env": {}, "labels": {}, "copy_sources": [], "from": None, "workdir": None}

    def expand(value: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], value)

    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        instruction, _, rest = line.strip().partition(" ")
        instruction = instruction.upper()
        if instruction == "ARG":
            name, eq, default = rest.strip().partition("=")
            if eq:
                args[name] = default
        elif instruction == "FROM":
            out["from"] = expand(rest.split()[0])
        elif instruction in ("ENV", "LABEL"):
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                out["env" if instruction == "ENV" else "labels"][key] = expand(value)
        elif instruction == "WORKDIR":
            out["workdir"] = rest.strip()
        elif instruction == "COPY":
            words = [w for w in rest.split() if not w.startswith("--")]
            out["copy_sources"] += words[:-1]
    return out


DOCKER = parse_dockerfile(DOCKERFILE.read_text())
RAY_VERSION = DOCKER["args"]["RAY_VERSION"]
VLLM_VERSION = DOCKER["args"]["VLLM_VERSION"]
IMAGE_TAG = f"ray{RAY_VERSION}-vllm{VLLM_VERSION}"
IMAGE_NAME = DOCKER["labels"]["org.opencontainers.image.title"]


def walk(node, path=""):
    """Every (path, key or list index, value) below `node`."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield f"{path}.{key}", key, value
            yield from walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield f"{path}[{i}]", i, value
            yield from walk(value, f"{path}[{i}]")


def images(doc: dict) -> list[tuple[str, str]]:
    return [(where, v) for where, key, v in walk(doc) if key in ("image", "head_image", "worker_image") and isinstance(v, str)]


def cluster_specs(doc: dict) -> list[dict]:
    """The RayCluster specs a KubeRay object creates (a RayCluster, or a RayJob's own cluster)."""
    spec = doc.get("spec", {})
    if doc.get("kind") == "RayCluster":
        return [spec]
    if doc.get("kind") == "RayJob" and "rayClusterSpec" in spec:
        return [spec["rayClusterSpec"]]
    return []


def all_cluster_specs() -> list[tuple[str, dict]]:
    return [
        (f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", spec)
        for path in sorted(KUBERAY.glob("*.yaml"))
        for doc in load_docs(path)
        for spec in cluster_specs(doc)
    ]


CLUSTERS = all_cluster_specs()
per_cluster = pytest.mark.parametrize("where, spec", CLUSTERS, ids=[where for where, _ in CLUSTERS])


def docs_of_kind(kind: str) -> list[dict]:
    return [d for p in sorted(KUBERAY.glob("*.yaml")) for d in load_docs(p) if d.get("kind") == kind]


def ray_container(pod_template: dict) -> dict:
    return pod_template["spec"]["containers"][0]  # KubeRay runs Ray in the first container


def gpu_quantity(resources: dict, section: str) -> int:
    return int(str(resources.get(section, {}).get("nvidia.com/gpu", 0)))


def gibibytes(quantity: str) -> float:
    """A Kubernetes memory quantity ("512Mi", "48Gi") in GiB."""
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i)?", str(quantity)).groups()
    return float(number) * 1024.0 ** ("KMGT".index(unit[0]) - 2 if unit else -3)


# -- checks: each returns a list of problems -------------------------------------------------


def gpu_problems(spec: dict) -> list[str]:
    """Head without GPUs; each worker group's nvidia.com/gpu equals its num-gpus start param."""
    problems = []
    head = spec["headGroupSpec"]
    head_res = ray_container(head["template"]).get("resources", {})
    if str(head["rayStartParams"].get("num-gpus")) != "0":
        problems.append("headGroupSpec.rayStartParams.num-gpus must be \"0\"")
    if gpu_quantity(head_res, "limits") or gpu_quantity(head_res, "requests"):
        problems.append("head container requests nvidia.com/gpu")
    for group in spec.get("workerGroupSpecs", []):
        name = group["groupName"]
        res = ray_container(group["template"]).get("resources", {})
        declared = group["rayStartParams"].get("num-gpus")
        if declared is None:
            if gpu_quantity(res, "limits"):
                problems.append(f"{name}: has nvidia.com/gpu but no rayStartParams.num-gpus")
            continue
        if gpu_quantity(res, "limits") != int(declared):
            problems.append(f"{name}: limits nvidia.com/gpu={gpu_quantity(res, 'limits')} but num-gpus={declared}")
        if "requests" in res and gpu_quantity(res, "requests") != int(declared):
            problems.append(f"{name}: requests nvidia.com/gpu={gpu_quantity(res, 'requests')} but num-gpus={declared}")
    return problems


def worker_gpu_groups(spec: dict) -> list[tuple[str, int, int]]:
    """(group, GPUs per pod, max pods) of the GPU worker groups of a KubeRay cluster spec."""
    return [
        (g["groupName"], int(g["rayStartParams"]["num-gpus"]), int(g["maxReplicas"]))
        for g in spec.get("workerGroupSpecs", [])
        if int(g["rayStartParams"].get("num-gpus", 0)) > 0
    ]


def ray_up_gpu_groups(cfg: dict) -> list[tuple[str, int, int]]:
    return [
        (name, int(t["resources"].get("GPU", 0)), int(t.get("max_workers", 0)))
        for name, t in cfg["available_node_types"].items()
        if name != cfg["head_node_type"] and t["resources"].get("GPU", 0) > 0
    ]


def engine_slots(groups: list[tuple[str, int, int]], gpus_per_engine: float) -> int:
    """How many engines needing `gpus_per_engine` GPUs (all on one node) the groups can host."""
    return sum(max_nodes * math.floor(gpus / gpus_per_engine) for _, gpus, max_nodes in groups)


def fit_problems(groups: list[tuple[str, int, int]], backbones: dict, compute: ComputeSpec, engines: int = 1) -> list[str]:
    """Backbones whose engine pool (GPUs each, `engines` of them) no GPU group can ever host."""
    problems = []
    for name, backbone in backbones.items():
        gpus = engine_pool(backbone, compute).num_gpus
        if gpus and engine_slots(groups, gpus) < engines:
            problems.append(f"{name}: {engines} engine(s) of {gpus} GPU(s) on one node do not fit {groups}")
    return problems


CRON_RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
CRON_NAMES = {
    3: {m: i + 1 for i, m in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())},
    4: {d: i for i, d in enumerate("SUN MON TUE WED THU FRI SAT".split())},
}


def cron_problems(expr: str) -> list[str]:
    """A standard 5-field cron expression (minute hour day-of-month month day-of-week)."""
    fields = expr.split()
    if len(fields) != 5:
        return [f"{expr!r}: expected 5 fields, got {len(fields)}"]
    problems = []
    for i, (field, (low, high)) in enumerate(zip(fields, CRON_RANGES)):
        names = CRON_NAMES.get(i, {})

        def value(token: str, names: dict = names) -> int | None:
            if token.upper() in names:
                return names[token.upper()]
            return int(token) if token.isdigit() else None

        for item in field.split(","):
            body, slash, step = item.partition("/")
            if slash and (not step.isdigit() or int(step) < 1):
                problems.append(f"{expr!r}: bad step in {item!r}")
                continue
            if body == "*" or (body == "?" and i in (2, 4)):
                continue
            start, dash, end = body.partition("-")
            bounds = [value(start)] + ([value(end)] if dash else [])
            if any(b is None or not low <= b <= high for b in bounds):
                problems.append(f"{expr!r}: {item!r} is outside {low}-{high}")
            elif dash and bounds[0] > bounds[1]:
                problems.append(f"{expr!r}: empty range {item!r}")
    return problems


CREDENTIAL_PATTERNS = [
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "an AWS access key id"),
    (
        re.compile(r"(?i)\b(" + "|".join(SECRET_NAMES) + r")\b[\"']?[ \t]*[:=][ \t]*[\"']?[^\s\"'#]+"),
        "a credential assigned a value",
    ),
]


def credential_problems(name: str, text: str) -> list[str]:
    """Inline credentials in a file's text, or in a YAML env entry {name: SECRET, value: ...}."""
    problems = [
        f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {what}"
        for pattern, what in CREDENTIAL_PATTERNS
        for m in pattern.finditer(text)
    ]
    if name.endswith(".yaml"):
        for doc in yaml.safe_load_all(text):
            for where, _, value in walk(doc):
                if isinstance(value, dict) and value.get("name") in SECRET_NAMES and "value" in value:
                    problems.append(f"{name}: {where} sets {value['name']} inline; use a Secret")
    return problems


def entry_command(doc: dict) -> str:
    """The command a RayJob or CronJob runs (entrypoint, or the container's command + args)."""
    if doc["kind"] == "RayJob":
        return doc["spec"]["entrypoint"]
    container = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    return " ".join(container.get("command", []) + container.get("args", []))


def script_args(command: str, script: str) -> list[str]:
    """The arguments after `python <...>script` in a command line."""
    words = shlex.split(command.replace("\\\n", " "))
    for i, word in enumerate(words):
        if word.endswith(script):
            return list(itertools.takewhile(lambda w: w not in ("&", "&&", ";", "|", "||"), words[i + 1 :]))
    raise AssertionError(f"{script} is not run by {command!r}")


def in_image(path: str) -> bool:
    """Whether the Dockerfile copies `path` (a repository-relative file) into the image."""
    return any(path == src.rstrip("/") or path.startswith(src.rstrip("/") + "/") for src in DOCKER["copy_sources"])


# -- every file parses ----------------------------------------------------------------------


def test_infra_has_every_deployment_file():
    names = {p.relative_to(INFRA).as_posix() for p in MANIFESTS}
    assert {"kuberay/raycluster.yaml", "kuberay/rayjob-sweep.yaml", "kuberay/cronjob-curate-nightly.yaml", "ray-up.yaml", "runtime_env.yaml"} <= names


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.relative_to(INFRA).as_posix())
def test_manifest_parses(path):
    for doc in load_docs(path):
        assert isinstance(doc, dict), f"{path.name}: a document is not a mapping"
        if path.parent == KUBERAY:
            assert {"apiVersion", "kind", "metadata", "spec"} <= doc.keys(), path.name


def test_dockerfile_pins_versions_and_uses_an_official_ray_gpu_image_for_python_311():
    assert re.fullmatch(r"\d+\.\d+\.\d+", RAY_VERSION) and re.fullmatch(r"\d+\.\d+\.\d+", VLLM_VERSION)
    assert re.fullmatch(rf"rayproject/ray:{re.escape(RAY_VERSION)}-py311-(cu\d+|gpu)", DOCKER["from"]), DOCKER["from"]
    assert DOCKER["labels"]["io.depict.ray-version"] == RAY_VERSION
    assert DOCKER["labels"]["io.depict.vllm-version"] == VLLM_VERSION


def test_dockerfile_versions_satisfy_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ray = next(Requirement(d) for d in project["dependencies"] if Requirement(d).name == "ray")
    vllm = next(Requirement(d) for d in project["optional-dependencies"]["vllm"] if Requirement(d).name == "vllm")
    assert ray.specifier.contains(RAY_VERSION), f"Dockerfile Ray {RAY_VERSION} is outside pyproject's {ray}"
    assert vllm.specifier.contains(VLLM_VERSION), f"Dockerfile vLLM {VLLM_VERSION} is outside pyproject's {vllm}"


def test_cluster_constraints_pin_exactly_and_leave_ray_and_vllm_to_the_dockerfile():
    lines = [ln.split("#")[0].strip() for ln in (INFRA / "requirements-cluster.txt").read_text().splitlines()]
    reqs = [Requirement(ln) for ln in lines if ln]
    assert reqs
    for req in reqs:
        assert len(req.specifier) == 1 and next(iter(req.specifier)).operator == "==", f"{req}: pin with =="
    assert not {"ray", "vllm"} & {r.name for r in reqs}, "Ray and vLLM versions live in the Dockerfile's ARGs"


# -- images and versions ----------------------------------------------------------------------


@pytest.mark.parametrize("path", [p for p in MANIFESTS if p != RUNTIME_ENV], ids=lambda p: p.relative_to(INFRA).as_posix())
def test_every_image_is_the_dockerfile_tag(path):
    found = [img for doc in load_docs(path) for img in images(doc)]
    assert found, f"{path.name} names no image"
    for where, image in found:
        repository, _, tag = image.rpartition(":")
        assert tag == IMAGE_TAG, f"{path.name} {where}: tag {tag!r}, Dockerfile builds {IMAGE_TAG!r}"
        assert repository.rsplit("/", 1)[-1] == IMAGE_NAME, f"{path.name} {where}: {image} is not {IMAGE_NAME}"
    assert len({img for _, img in found}) == 1, f"{path.name} mixes images"


def test_ray_version_fields_equal_the_image_ray():
    assert len(CLUSTERS) >= 2  # the RayCluster and the sweep's RayJob
    for where, spec in CLUSTERS:
        assert spec["rayVersion"] == RAY_VERSION, where


# -- GPUs and autoscaling -----------------------------------------------------------------------


@per_cluster
def test_gpu_limits_match_num_gpus_and_the_head_has_none(where, spec):
    assert gpu_problems(spec) == []


def test_gpu_check_catches_mismatches():
    _, spec = CLUSTERS[0]
    bad = copy.deepcopy(spec)
    bad["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    bad["headGroupSpec"]["rayStartParams"]["num-gpus"] = "1"
    problems = gpu_problems(bad)
    assert any("num-gpus must be" in p for p in problems)
    assert any("limits nvidia.com/gpu=2 but num-gpus=1" in p for p in problems)


@per_cluster
def test_autoscaling_scales_gpu_groups_from_zero(where, spec):
    assert spec["enableInTreeAutoscaling"] is True
    groups = worker_gpu_groups(spec)
    assert {gpus for _, gpus, _ in groups} >= {1, 2}, "need a 1-GPU group and a 2-GPU (tensor parallel) group"
    for group in spec["workerGroupSpecs"]:
        assert group["minReplicas"] == 0, f"{group['groupName']}: idle GPUs should scale to zero"
        assert group["minReplicas"] <= group.get("replicas", 0) <= group["maxReplicas"], group["groupName"]
        assert group["maxReplicas"] >= 1, group["groupName"]


@per_cluster
def test_ray_pods_mount_a_shared_memory_as_large_as_the_object_store(where, spec):
    groups = [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec["workerGroupSpecs"]]
    for name, group in groups:
        volumes = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
        container = ray_container(group["template"])
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        shm = volumes[mounts["/dev/shm"]]["emptyDir"]
        assert shm["medium"] == "Memory", name
        memory = gibibytes(container["resources"]["limits"]["memory"])
        assert gibibytes(shm["sizeLimit"]) >= 0.3 * memory, f"{name}: Ray's object store takes 30% of {memory} GiB"


@per_cluster
def test_gpu_pods_cache_models_on_a_volume(where, spec):
    cache = DOCKER["env"]["HF_HOME"]
    for group in spec["workerGroupSpecs"]:
        mounts = [m["mountPath"] for m in ray_container(group["template"])["volumeMounts"]]
        assert any(cache.startswith(path.rstrip("/") + "/") for path in mounts), f"{group['groupName']}: {cache} is on no volume"


def test_quantity_parser():
    assert gibibytes("48Gi") == 48 and gibibytes("512Mi") == 0.5 and gibibytes("1Ti") == 1024
    assert gibibytes(str(2 * 1024**3)) == 2


def _all_vllm_backbones() -> dict:
    names = sorted(p.stem for p in (ROOT / "conf" / "backbones").glob("*.yaml"))
    cfg = load_config([f"backbones=[{','.join(names)}]", "questions.source=benchmark", "root=s3://bucket/x"])
    return {n: b for n, b in cfg.backbones.items() if b.engine == "vllm"}


def test_every_backbone_fits_a_gpu_group():
    backbones = _all_vllm_backbones()
    assert any(b.tensor_parallel_size > 1 for b in backbones.values())
    groups = {where: worker_gpu_groups(spec) for where, spec in CLUSTERS}
    groups["ray-up.yaml"] = ray_up_gpu_groups(load_docs(RAY_UP)[0])
    for where, cluster_groups in groups.items():
        assert fit_problems(cluster_groups, backbones, ComputeSpec()) == [], where


def test_fit_check_catches_a_backbone_too_wide_for_every_group():
    backbones = _all_vllm_backbones()
    wide = copy.deepcopy(next(iter(backbones.values())))
    wide.tensor_parallel_size = 8
    groups = worker_gpu_groups(CLUSTERS[0][1])
    assert fit_problems(groups, {"wide": wide}, ComputeSpec())
    assert engine_slots([("g", 4, 2)], 2) == 4 and engine_slots([("g", 1, 8)], 2) == 0


# -- the sweep RayJob ---------------------------------------------------------------------------


def test_sweep_rayjob_cleans_up_and_bounds_its_runtime():
    [job] = docs_of_kind("RayJob")
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] > 0
    assert spec["activeDeadlineSeconds"] > 0
    assert spec["backoffLimit"] >= 0


def test_sweep_rayjob_runs_an_existing_preset_on_s3_and_its_engine_pool_fits():
    [job] = docs_of_kind("RayJob")
    args = script_args(entry_command(job), "jobs/sweep.py")
    assert (ROOT / "jobs" / "sweep.py").exists()
    assert any(a.startswith("root=s3://") for a in args), "a multi-node run needs root=s3://..."
    cfg = load_config(args)  # fails on a preset, backbone or override that does not exist
    groups = worker_gpu_groups(job["spec"]["rayClusterSpec"])
    engines = cfg.sweep.compute.engines_per_backbone
    assert fit_problems(groups, cfg.backbones, cfg.sweep.compute, engines) == []


def test_sweep_rayjob_runtime_env_is_the_runtime_env_file():
    [job] = docs_of_kind("RayJob")
    assert yaml.safe_load(job["spec"]["runtimeEnvYAML"]) == yaml.safe_load(RUNTIME_ENV.read_text())
    submitter = job["spec"]["submitterPodTemplate"]["spec"]["containers"][0]
    assert submitter["workingDir"] == DOCKER["workdir"]  # working_dir "." is then the code baked in the image
    assert in_image("jobs/sweep.py")


# -- the runtime environment ----------------------------------------------------------------------


def test_runtime_env_file_is_valid_for_ray_and_complete():
    from ray.runtime_env import RuntimeEnv

    env = yaml.safe_load(RUNTIME_ENV.read_text())
    assert set(env) <= set(RuntimeEnv.known_fields), set(env) - set(RuntimeEnv.known_fields)
    RuntimeEnv(**env)  # Ray's own type checks
    assert env["working_dir"] == "."
    assert {"outputs/", "runs/", ".venv/", ".git/"} <= set(env["excludes"])
    assert env["env_vars"]["TOKENIZERS_PARALLELISM"] == "false"
    assert "HF_HOME" in env["env_vars"]
    for name in env["env_vars"].keys() & DOCKER["env"].keys():
        assert env["env_vars"][name] == DOCKER["env"][name], f"{name} differs from the image's ENV"
    assert not set(SECRET_NAMES) & set(env["env_vars"]), "credentials come from the nodes, never the runtime env"


# -- the nightly curation -------------------------------------------------------------------------


def test_nightly_curation_is_a_valid_cron_that_never_overlaps():
    [cron] = docs_of_kind("CronJob")
    assert cron_problems(cron["spec"]["schedule"]) == []
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    assert cron["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] < 24 * 3600, "a stuck night must end before the next"


def test_nightly_curation_runs_an_existing_script_on_s3():
    [cron] = docs_of_kind("CronJob")
    args = script_args(entry_command(cron), "jobs/curate.py")
    assert (ROOT / "jobs" / "curate.py").exists(), "the nightly runs jobs/curate.py, which the repository lacks"
    assert in_image("jobs/curate.py")
    assert any(a.startswith("root=s3://") for a in args), "a multi-node run needs root=s3://..."


def test_nightly_curation_submits_to_the_raycluster_head_with_the_runtime_env():
    [cron] = docs_of_kind("CronJob")
    runtime_env = re.search(r"--runtime-env\s+(\S+)", entry_command(cron)).group(1)
    assert (ROOT / runtime_env).exists() and in_image(runtime_env), runtime_env

    [cluster] = docs_of_kind("RayCluster")
    head = ray_container(cluster["spec"]["headGroupSpec"]["template"])
    dashboard = next(p["containerPort"] for p in head["ports"] if p["name"] == "dashboard")
    container = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RAY_ADDRESS"] == f"http://{cluster['metadata']['name']}-head-svc:{dashboard}"
    assert container["workingDir"] == DOCKER["workdir"]  # working_dir "." is then the code baked in the image


@pytest.mark.parametrize("expr", ["30 1 * * *", "0 */6 * * MON-FRI", "15,45 2 1-7 JAN,jul 0", "0 0 ? * 7", "*/5 * * * *"])
def test_cron_check_accepts(expr):
    assert cron_problems(expr) == []


@pytest.mark.parametrize("expr", ["30 1 * *", "60 1 * * *", "0 24 * * *", "0 0 0 * *", "0 0 * 13 *", "0 0 * * 8", "0 0 * * MON-SUN-X", "5-1 * * * *", "*/0 * * * *", "@daily", "0 0 ? * * *"])
def test_cron_check_rejects(expr):
    assert cron_problems(expr)


@given(st.tuples(*[st.integers(low, high) for low, high in CRON_RANGES]))
def test_cron_check_accepts_every_in_range_time(values):
    assert cron_problems(" ".join(map(str, values))) == []


@given(st.integers(0, 4), st.integers(60, 10_000))
def test_cron_check_rejects_any_out_of_range_value(field, value):
    fields = ["0", "0", "1", "1", "0"]
    fields[field] = str(value)
    assert cron_problems(" ".join(fields))


# -- ray up ---------------------------------------------------------------------------------------


def test_ray_up_config_matches_rays_schema():
    schema = json.loads((files("ray.autoscaler") / "ray-schema.json").read_text())
    cfg = load_docs(RAY_UP)[0]
    errors = [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(cfg)]
    assert errors == []


def test_ray_up_node_types_declare_the_gpus_their_instances_have():
    cfg = load_docs(RAY_UP)[0]
    for name, node_type in cfg["available_node_types"].items():
        instance = node_type["node_config"]["InstanceType"]
        assert instance in INSTANCE_GPUS, f"{name}: add {instance} to INSTANCE_GPUS"
        assert node_type["resources"].get("GPU", 0) == INSTANCE_GPUS[instance], f"{name} ({instance})"
    head = cfg["available_node_types"][cfg["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert {gpus for _, gpus, _ in ray_up_gpu_groups(cfg)} & {1} and max(g for _, g, _ in ray_up_gpu_groups(cfg)) >= 2


def test_ray_up_containers_cache_models_on_the_host_nvme():
    docker = load_docs(RAY_UP)[0]["docker"]
    targets = [opt.split(":")[1] for opt in docker["run_options"] if opt.startswith("-v ")]
    assert any(DOCKER["env"]["HF_HOME"].startswith(t.rstrip("/") + "/") for t in targets), targets


def test_ray_up_setup_installs_nothing_heavy():
    cfg = load_docs(RAY_UP)[0]
    commands = [c for key in ("setup_commands", "head_setup_commands", "worker_setup_commands") for c in cfg.get(key, [])]
    for node_type in cfg["available_node_types"].values():
        commands += node_type.get("worker_setup_commands", [])
    assert not [c for c in commands if re.search(r"\b(pip|uv|conda)\b.*\b(torch|vllm|ray)\b", c)]
    assert 0 < cfg["idle_timeout_minutes"] and cfg["max_workers"] >= sum(n for _, _, n in ray_up_gpu_groups(cfg))


# -- credentials ------------------------------------------------------------------------------------


def test_no_inline_credentials_in_infra():
    problems = []
    for path in sorted(p for p in INFRA.rglob("*") if p.is_file()):
        problems += credential_problems(path.relative_to(ROOT).as_posix(), path.read_text())
    assert problems == []


@pytest.mark.parametrize(
    "name, text",
    [
        ("Dockerfile", "ENV AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG\n"),
        ("x.txt", "aws_access_key_id = AKIAIOSFODNN7EXAMPLE\n"),
        ("env.yaml", "env_vars:\n  HF_TOKEN: hf_abcdefghijklmnop\n"),
        ("pod.yaml", "env:\n  - name: AWS_SECRET_ACCESS_KEY\n    value: abc\n"),
        ("ray-up.yaml", "provider:\n  aws_secret_access_key: \"abc/def\"\n"),
    ],
)
def test_credential_scan_finds_inline_secrets(name, text):
    assert credential_problems(name, text)


def test_credential_scan_accepts_secret_references():
    text = (
        "envFrom:\n  - secretRef: {name: depict-credentials, optional: true}\n"
        "env:\n  - name: AWS_SECRET_ACCESS_KEY\n    valueFrom:\n      secretKeyRef: {name: s3, key: secret}\n"
    )
    assert credential_problems("pod.yaml", text) == []


def test_ray_pods_take_credentials_from_a_secret():
    for where, spec in CLUSTERS:
        templates = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
        for template in templates:
            container = ray_container(template)
            refs = [e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e]
            refs += [e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})]
            assert refs, f"{where}: {container['name']} gets no credentials Secret (S3 needs them, or IRSA)"
