import hashlib
import importlib.util

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate


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
DEVICE = config["device"]


def _check_config():
    """Fail at start, naming the key, for references a schema cannot check."""
    if DEVICE not in config["devices"]:
        raise WorkflowError(
            f"config key 'device': '{DEVICE}' is not one of devices {sorted(config['devices'])}"
        )
    for part, names in config["study"].items():
        for name in names:
            if name not in config["models"]:
                raise WorkflowError(
                    f"config key 'study.{part}': model '{name}' is not defined under 'models' "
                    f"(defined: {sorted(config['models'])})"
                )
    for name, spec in config["models"].items():
        if spec.get("source", "transformers") == "transformers":
            import transformers

            arch = spec["architecture"]
            if not hasattr(getattr(transformers, arch, None), "config_class"):
                raise WorkflowError(
                    f"config key 'models.{name}.architecture': unknown transformers class '{arch}'"
                )
        else:
            target = spec["callable"].partition(":")[0]
            if importlib.util.find_spec(target.split(".")[0]) is None:
                raise WorkflowError(
                    f"config key 'models.{name}.callable': module '{target}' is not importable"
                )


_check_config()


wildcard_constraints:
    model="|".join(sorted(config["models"])),
    device="[A-Za-z0-9_-]+",
    backend="cpu|cuda",
    k="[1-9][0-9]*",
    budget=r"[0-9]*\.?[0-9]+",


def code_version(*modules):
    """Short hash of the trainplan modules a rule's result depends on: editing them reruns the rule."""
    digest = hashlib.sha256()
    for name in modules:
        spec = importlib.util.find_spec(f"trainplan.{name}")
        if spec is None or spec.origin is None:
            raise WorkflowError(f"trainplan module '{name}' not found: is the package installed (pip install -e .)?")
        digest.update(open(spec.origin, "rb").read())
    return digest.hexdigest()[:12]


def model_spec(wildcards):
    """The config entry of the model named by the wildcard."""
    return config["models"][wildcards.model]


def device_spec(wildcards):
    """The config entry of the device named by the wildcard."""
    return config["devices"][wildcards.device]


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


def export_inputs(wildcards):
    """Graph artifacts of the wildcard's model, traced on the wildcard device's type."""
    return graph_files(wildcards.model, backend_of(wildcards.device))


def schedule_tables(wildcards):
    """Schedule comparison tables of one model, device and k over every budget."""
    return expand(
        "results/schedule/{model}/{device}/k{k}/b{budget}/compare.csv",
        budget=config["budgets"],
        **wildcards,
    )


def validation_files():
    """Validation documents of every planned model, budget and stage count."""
    return expand(
        "results/validate/{model}/{device}/k{k}/b{budget}/validation.json",
        model=MODELS,
        device=DEVICE,
        k=config["stages"],
        budget=config["budgets"],
    )


LAYOUT_MODELS = config["study"].get("layout", [])


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
        "results/plots/layout/{model}/{device}/layout.png", model=LAYOUT_MODELS, device=DEVICE
    ) + expand(["results/layout/{device}/summary.csv", "results/plots/layout/{device}/summary.png"], device=DEVICE)


def all_targets():
    """Every final artifact of the study."""
    return expand(
        [
            "results/profile/{model}/{device}/ops.parquet",
            "results/plots/{model}/{device}/op_time.png",
        ],
        model=MODELS,
        device=DEVICE,
    ) + expand("results/plots/{model}/{backend}/memory.png", model=MODELS, backend=backend_of(DEVICE)) + expand(
        [
            "results/partition/{model}/{device}/k{k}/partition.json",
            "results/plots/{model}/{device}/k{k}/schedule_overhead.png",
            "results/balance/{model}/{device}/k{k}/b{budget}/plan.json",
            "results/plots/{model}/{device}/k{k}/b{budget}/balance.png",
            "results/plots/{model}/{device}/k{k}/b{budget}/validation.png",
        ],
        model=MODELS,
        device=DEVICE,
        k=config["stages"],
        budget=config["budgets"],
    ) + ["results/validate/summary.csv"] + (
        ["results/overflow/study.csv", "results/plots/overflow/overflow.png"]
        if config["study"].get("overflow")
        else []
    ) + layout_targets()
