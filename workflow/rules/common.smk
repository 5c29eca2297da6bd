import hashlib
import importlib.util
import os
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

REPO = Path(workflow.main_snakefile).resolve().parent


def _check_checkout():
    """Fail at start unless the scripts will import trainplan from this checkout's src/ (``pip install -e .``):
    the code versions below are computed from the checkout's files, which must be the code that runs."""
    spec = importlib.util.find_spec("trainplan")
    here = REPO / "src" / "trainplan" / "__init__.py"
    if spec is None or spec.origin is None or Path(spec.origin).resolve() != here:
        where = "not installed" if spec is None else f"imported from {spec.origin}"
        raise WorkflowError(f"trainplan is {where}, not from this checkout ({here}): run `pip install -e {REPO}`")


_check_checkout()

# Imported at every start (a dry run too): none of these imports torch (tests/test_imports.py).
from trainplan.budget import WILDCARD as BUDGET_WILDCARD
from trainplan.config_checks import ConfigError, budget_wildcards, check_config, config_devices
from trainplan.fuse.errors import FuseError
from trainplan.fuse.planned import CALLABLE as FUSED_CALLABLE, fused_spec
from trainplan.io import read_yaml
from trainplan.memory_model import memory_model
from trainplan.precision.policy import PolicyError, load_policy
from trainplan.provenance.code import closure as code_closure, digest as code_digest
from trainplan.schedule.pipeline_hold import refusal as pipeline_refusal
from trainplan.start_checks import check_table, default_record


validate(config, schema="../schemas/config.schema.yaml")


def _sorted_keys(value):
    """The value with every mapping's keys sorted, so params do not depend on the order keys were written in."""
    if isinstance(value, dict):
        return {key: _sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(item) for item in value]
    return value


for _key in list(config):
    config[_key] = _sorted_keys(config[_key])

MODELS = config["study"]["plan"]
# A planned model is planned a second time as model '<model>+<target>': the model with its forward groups for the
# target as fused ops, exported, profiled and planned like any model (fuse.plan; docs/fuse.md).
FUSED_PLAN = [f"{model}+{target}" for model in MODELS for target in config["fuse"]["plan"]]
PLAN_MODELS = MODELS + FUSED_PLAN
# The alignment stage runs over every model of the study (planned or overflow-checked), each once.
ALIGN_MODELS = list(dict.fromkeys(MODELS + config["study"].get("overflow", [])))
# One device or a list of them (a sweep over devices): every planned result is made for each.
DEVICES = config_devices(config)


# The start-up checks that import torch run once per checked content (trainplan.start_checks).
START_CHECKS = default_record()


try:  # references between keys, model entries, budgets (trainplan.config_checks): named before any job runs
    check_config(config, START_CHECKS)
    BUDGETS = budget_wildcards(config["budgets"])
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None


PIPELINE_SCHEDULE = "|".join(config["pipeline"]["schedules"])
# A pipeline has two stages at least: k=1 plans are not run as pipelines.
PIPELINE_K = r"[2-9]|[1-9][0-9]+"


def pipeline_settings(*keys):
    """The `pipeline` config keys the pipeline rule uses (the schedule and m are its wildcards)."""
    return {key: config["pipeline"][key] for key in keys}


def stages_per_rank(schedule):
    """The stages each rank of a pipeline run under ``schedule`` runs: pipeline.stages_per_rank under
    Interleaved1F1B, else one."""
    return config["pipeline"]["stages_per_rank"] if schedule == "interleaved1f1b" else 1


def pipeline_placement(wildcards):
    """Input function: the stages per rank of the run's schedule."""
    return stages_per_rank(wildcards.schedule)


def pipeline_runs():
    """(k, schedule, m) of every pipeline run: each k >= 2 of `stages`, schedule and m of `pipeline` where the
    schedule runs them (trainplan.schedule.pipeline_hold.refusal: 1F1B needs m >= k; Interleaved1F1B v stages on
    each of k / v >= 2 ranks, m in whole rounds)."""
    return [
        (k, schedule, m)
        for k in config["stages"] if k >= 2
        for schedule in config["pipeline"]["schedules"]
        for m in config["pipeline"]["micro_batches"]
        if pipeline_refusal(k, schedule, m, stages_per_rank(schedule)) is None
    ]


def study_stages():
    """(what, models) for each part of the study, after config layering: the start-up summary."""
    parts = [
        ("study.plan (export, profile, partition, schedule, balance, validate)", MODELS),
        ("study.overflow (fp16 overflow loop)", config["study"].get("overflow", [])),
        ("align (every plan and overflow model)", ALIGN_MODELS),
        ("fuse.targets (on every plan model)", sorted(config["fuse"]["targets"])),
        ("fuse.measure.targets (compiled and timed)", config["fuse"]["measure"]["targets"]),
        ("fuse.plan (fused models planned and validated too)", FUSED_PLAN),
        ("pipeline (plans with k >= 2 run as torchrun pipelines)", MODELS if pipeline_runs() else []),
    ]
    return parts + [(f"study.{part}", names) for part, names in config["study"].items() if part not in ("plan", "overflow")]


def _print_study():
    """Which models each stage runs, on which devices, stage counts and budgets: once, to stderr."""
    lines = [f"trainplan study on {', '.join(DEVICES)}: stages k={config['stages']}, budgets {config['budgets']}"]
    lines += [f"  {what}: {', '.join(names) or 'none'}" for what, names in study_stages()]
    refused = [(k, s, m, pipeline_refusal(k, s, m, stages_per_rank(s))) for k in config["stages"] if k >= 2
               for s in config["pipeline"]["schedules"] for m in config["pipeline"]["micro_batches"]]
    lines += [f"  pipeline: {s} not run at k={k}, m={m} ({why})" for k, s, m, why in refused if why]
    print("\n".join(lines), file=sys.stderr)


if workflow.is_main_process:
    _print_study()


RAW_MODEL = "|".join(re.escape(name) for name in sorted(config["models"]))
FUSE_TARGET = "|".join(sorted(config["fuse"]["targets"]))


wildcard_constraints:
    model="|".join([RAW_MODEL] + [re.escape(name) for name in FUSED_PLAN]),
    device="[A-Za-z0-9_-]+",
    backend="cpu|cuda",
    k="[1-9][0-9]*",
    budget=BUDGET_WILDCARD,




def _callable_modules(model_names):
    """Modules named by the `callable` of each of these models' specs (built by trainplan.models): a fused model's
    is trainplan.fuse.planned, then the callable of the model it fuses."""
    specs = [planned_spec(name) for name in model_names]
    specs += [spec["kwargs"]["spec"] for spec in specs if spec.get("callable") == FUSED_CALLABLE]
    return sorted({spec["callable"].partition(":")[0] for spec in specs if spec.get("source") == "callable"})


def _module_digest(name):
    """Digest of a model's callable module outside this repository (its file's bytes, under its name)."""
    spec = importlib.util.find_spec(name)
    data = open(spec.origin, "rb").read() if spec is not None and spec.origin else b""
    return hashlib.sha256(b"\0".join([name.encode(), data])).hexdigest()[:16]


def _models_code_version(path, wildcards):
    """code_version of a script that builds models: with the modules of the models' callables (of the
    wildcard's model, or of every configured model), the package's closures and others' own files."""
    names = [wildcards.model] if "model" in wildcards.keys() else sorted(config["models"])
    modules = _callable_modules(names)
    ours = [name for name in modules if name.partition(".")[0] == "trainplan"]
    digests = [code_digest(REPO, code_closure(REPO, path, *ours).files)]
    digests.extend(_module_digest(name) for name in modules if name not in ours)
    return "-".join(digests)


def code_version(script):
    """The `code` param of the rules that run workflow/scripts/<script>.py, the digest of every file of this checkout
    the script runs (the transitive closure of its trainplan imports; trainplan.provenance.code), so that editing any
    of them reruns the rule and nothing else. A rule that builds models (trainplan.models) also depends on the
    module of a model's `callable`."""
    path = f"workflow/scripts/{script}.py"
    found = code_closure(REPO, path)
    if "trainplan.models" not in found.modules:
        return code_digest(REPO, found.files)
    return lambda wildcards: _models_code_version(path, wildcards)


def study_file(path):
    """A file named in config: relative to the working directory, else to the workflow's own directory
    (a study run with `--directory` elsewhere still finds e.g. config/precision_policy.yaml)."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    return os.path.join(os.path.dirname(os.path.abspath(workflow.main_snakefile)), path)


def _check_config_files():
    """Fail at start, naming the config key and the file (and a YAML error's line), for a file the config names
    that does not load: the precision policy and each fuse support table (their rules would fail later)."""
    files = {"overflow.policy": (load_policy, config["overflow"]["policy"])} | {
        f"fuse.targets.{name}.table": (lambda path: check_table(path, START_CHECKS), spec["table"])
        for name, spec in config["fuse"]["targets"].items() if "table" in spec
    }
    for key, (load, path) in files.items():
        try:
            load(study_file(path))
        except (PolicyError, FuseError) as exc:
            raise WorkflowError(f"config key '{key}': {exc}") from None


_check_config_files()


def fused_target(target):
    """A fusion target as a fused model's spec holds it: {builtin: inductor}, or its YAML table's content (an
    edit of the table changes the spec, so the fused model's rules rerun)."""
    spec = config["fuse"]["targets"][target]
    return dict(spec) if "builtin" in spec else read_yaml(study_file(spec["table"]), "support table")


def planned_spec(name):
    """The spec a model name is built from: its config entry, or for '<model>+<target>' the spec of the model with
    its forward groups for the target as fused ops (trainplan.fuse.planned.fused_spec, settings fuse.fused_ops)."""
    model, _, target = name.partition("+")
    if not target:
        return config["models"][model]
    settings = config["fuse"]["fused_ops"]
    return fused_spec(model, config["models"][model], fused_target(target), seed=config["seed"],
                      min_ops=settings["min_ops"], max_ops=settings["max_ops"], compiler=settings["compiler"])


def model_spec(wildcards):
    """The spec of the model named by the wildcard (planned_spec)."""
    return planned_spec(wildcards.model)


def fused_check(wildcards):
    """For a fused model '<model>+<target>', the tolerances its gradients are checked with against the unfused
    model's (fuse.train's grad_rtol and grad_atol: trainplan.fuse.planned.gradients_vs_unfused); else none."""
    if "+" not in wildcards.model:
        return {}
    train = config["fuse"]["train"]
    return {"rtol": train["grad_rtol"], "atol": train["grad_atol"]}


def device_spec(wildcards):
    """The config entry of the device named by the wildcard."""
    return config["devices"][wildcards.device]


def memory_model_of(device):
    """The memory model of a key of `devices`: host memory shared or separate (`host_memory`, else by type), whether
    plans may swap, and a note for the artifacts and captions (trainplan.memory_model.memory_model)."""
    spec = config["devices"][device]
    return memory_model(spec["type"], spec.get("host_memory")).to_dict()


def device_memory_model(wildcards):
    """The memory model of the device named by the wildcard (memory_model_of)."""
    return memory_model_of(wildcards.device)


def backend_of(device):
    """The device type (cpu or cuda) of a key of `devices`: the graph is traced on it."""
    return config["devices"][device]["type"]


def graph_files(model, backend):
    """Paths of the graph artifacts of one model traced on one device type."""
    return {
        "nodes": f"results/export/{model}/{backend}/nodes.parquet",
        "tensors": f"results/export/{model}/{backend}/tensors.parquet",
        "summary": f"results/export/{model}/{backend}/graph.json",
    }


def traced_graph_inputs(wildcards):
    """Graph artifacts of the wildcard's model (a fused model's too) as traced on the wildcard device's type."""
    return graph_files(wildcards.model, backend_of(wildcards.device))


def schedule_tables(wildcards):
    """Schedule comparison tables of one model, device and k over every budget."""
    return expand(
        "results/schedule/{model}/{device}/k{k}/b{budget}/compare.csv",
        budget=BUDGETS,
        **wildcards,
    )


def validation_files():
    """Validation documents of every planned model (fused models included), budget and stage count."""
    return expand(
        "results/validate/{model}/{device}/k{k}/b{budget}/validation.json",
        model=PLAN_MODELS,
        device=DEVICES,
        k=config["stages"],
        budget=BUDGETS,
    )


def align_policy(wildcards):
    """Precision policy of the model's ops for alignment: the overflow loop's final policy when the model
    has an overflow run, else the starting policy (`overflow.policy`)."""
    if wildcards.model in config["study"].get("overflow", []):
        return f"results/overflow/{wildcards.model}/final_policy.yaml"
    return study_file(config["overflow"]["policy"])


def fuse_table_files(wildcards):
    """The YAML support table of the wildcard's fusion target (none for a builtin one), found as study_file does."""
    spec = config["fuse"]["targets"][wildcards.target]
    return [study_file(spec["table"])] if "table" in spec else []


def fuse_measure_files(wildcards):
    """Per-group fused/unfused times of the wildcard's model and target, when that target is measured."""
    if wildcards.target in config["fuse"]["measure"]["targets"]:
        return ["results/fuse/{model}/{device}/{target}/measure.parquet".format(**wildcards)]
    return []


def fuse_targets():
    """Fusion groups and figures of every planned model and target; measurements and fused training steps of
    the measured targets; the comparison of plans on the fused models (fuse.plan) with the raw models'."""
    for key in ("measure.targets", "train.targets", "plan"):
        section, _, item = key.partition(".")
        names = config["fuse"][section][item] if item else config["fuse"][section]
        unknown = sorted(set(names) - set(config["fuse"]["targets"]))
        if unknown:
            raise WorkflowError(f"config key 'fuse.{key}': '{unknown[0]}' is not one of fuse.targets")
    compare = expand(["results/fuse/{device}/plan_compare.csv", "results/plots/fuse/{device}/plan_compare.png"],
                     device=DEVICES) if config["fuse"]["plan"] and MODELS else []
    return compare + expand(
        ["results/fuse/{model}/{device}/{target}/groups.json", "results/plots/{model}/{device}/fuse_{target}.png"],
        model=MODELS, device=DEVICES, target=sorted(config["fuse"]["targets"]),
    ) + expand("results/fuse/{model}/{device}/{target}/measure.json", model=MODELS, device=DEVICES,
               target=config["fuse"]["measure"]["targets"]) + expand(
        "results/plots/{model}/{device}/fuse_train_{target}.png", model=MODELS, device=DEVICES,
        target=config["fuse"]["train"]["targets"])


def fuse_plan_cases():
    """Every planned (model, graph, k, budget) for the fused-vs-raw comparison, graph 'raw' or a target of
    fuse.plan (model '<model>+<target>')."""
    return [
        {"model": model, "graph": graph, "name": model if graph == "raw" else f"{model}+{graph}", "k": k,
         "budget": budget}
        for model in MODELS
        for graph in ["raw"] + config["fuse"]["plan"]
        for k in config["stages"]
        for budget in BUDGETS
    ]


def fuse_plan_inputs(wildcards):
    """Export summary, partition, schedules, plan and validation of every case of fuse_plan_cases on the wildcard's
    device."""
    cases = fuse_plan_cases()
    where = lambda c: f"{c['name']}/{wildcards.device}/k{c['k']}"
    backend = backend_of(wildcards.device)
    return {
        "graphs": [graph_files(c["name"], backend)["summary"] for c in cases],
        "partitions": [f"results/partition/{where(c)}/partition.json" for c in cases],
        "schedules": [f"results/schedule/{where(c)}/b{c['budget']}/schedules.json" for c in cases],
        "plans": [f"results/balance/{where(c)}/b{c['budget']}/plan.json" for c in cases],
        "validations": [f"results/validate/{where(c)}/b{c['budget']}/validation.json" for c in cases],
    }


LAYOUT_MODELS = config["study"].get("layout", [])


def layout_settings(*keys):
    """The `layout` config keys a rule uses (so that changing another key does not re-run its timings)."""
    return {key: config["layout"][key] for key in keys}


def layout_measurements(wildcards):
    """Measured conv, group and edge tables of the wildcard's model at the layout stage."""
    return {
        name: f"results/layout/{wildcards.model}/{wildcards.device}/{name}.parquet"
        for name in ("convs", "groups", "edges")
    }


def layout_files(name):
    """Input function: the layout-stage file ``name`` of every model in `study.layout`."""
    return lambda wildcards: expand(
        "results/layout/{model}/{device}/{name}", model=LAYOUT_MODELS, device=wildcards.device, name=name
    )


def layout_targets():
    """Final artifacts of the layout stage (none when `study.layout` is empty)."""
    if not LAYOUT_MODELS:
        return []
    return expand(
        "results/plots/layout/{model}/{device}/layout.png", model=LAYOUT_MODELS, device=DEVICES
    ) + expand(["results/layout/{device}/summary.csv", "results/plots/layout/{device}/summary.png"], device=DEVICES)


def frontier_targets():
    """The frontier table, verdicts and figure of every model in `study.frontier` on every CPU device (the rule
    refuses others)."""
    return expand(
        [
            "results/frontier/{model}/{device}/verdicts.json",
            "results/plots/{model}/{device}/frontier.png",
        ],
        model=config["study"].get("frontier", []),
        device=[d for d in DEVICES if backend_of(d) == "cpu"],
    )


def pipeline_targets():
    """The artifact and timeline figure of every pipeline run of every planned model (not the fused models),
    device and budget; with `pipeline.methods`, the partition methods' comparison of each run too."""
    paths = ["results/pipeline/{model}/{device}/k{k}/b{budget}/{schedule}_m{m}.json",
             "results/plots/{model}/{device}/k{k}/b{budget}/pipeline_{schedule}_m{m}.png"]
    if config["pipeline"]["methods"]:
        paths += ["results/pipeline/{model}/{device}/k{k}/b{budget}/methods_{schedule}_m{m}.csv",
                  "results/plots/{model}/{device}/k{k}/b{budget}/pipeline_methods_{schedule}_m{m}.png"]
    return [
        path.format(model=model, device=device, k=k, budget=budget, schedule=schedule, m=m)
        for model in MODELS
        for device in DEVICES
        for budget in BUDGETS
        for k, schedule, m in pipeline_runs()
        for path in paths
    ]


def all_targets():
    """Every final artifact of the study."""
    return expand(
        [
            "results/profile/{model}/{device}/ops.parquet",
            "results/plots/{model}/{device}/op_time.png",
        ],
        model=PLAN_MODELS,
        device=DEVICES,
    ) + expand(
        "results/plots/{model}/{backend}/memory.png", model=PLAN_MODELS, backend=sorted({backend_of(d) for d in DEVICES})
    ) + expand(
        [
            "results/partition/{model}/{device}/k{k}/partition.json",
            "results/schedule/{model}/{device}/k{k}/b{budget}/schedules.json",
            "results/plots/{model}/{device}/k{k}/schedule_overhead.png",
            "results/balance/{model}/{device}/k{k}/b{budget}/plan.json",
            "results/plots/{model}/{device}/k{k}/b{budget}/balance.png",
            "results/plots/{model}/{device}/k{k}/b{budget}/validation.png",
            "results/plots/{model}/{device}/k{k}/b{budget}/plan_memory.png",
        ],
        model=PLAN_MODELS,
        device=DEVICES,
        k=config["stages"],
        budget=BUDGETS,
    ) + ["results/validate/summary.csv"] + fuse_targets() + (
        ["results/overflow/study.csv", "results/plots/overflow/overflow.png"]
        if config["study"].get("overflow")
        else []
    ) + expand("results/plots/overflow/{model}/passes.png", model=config["study"].get("overflow", [])) + [
        "results/align/study.csv",
        "results/plots/align/align.png",
        "results/provenance.json",
    ] + layout_targets() + frontier_targets() + pipeline_targets()
