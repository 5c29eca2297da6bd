# Stage 7 (seed 000): fp16 overflow loop. Each S1-S3 pass is one checkpoint job (cached per iteration);
# `overflow_iterations` walks the passes until one converges or `overflow.max_iterations` is reached.


wildcard_constraints:
    i=r"\d+",


def overflow_iteration_inputs(wildcards):
    """Policy a pass starts from (the configured default at pass 0) and the previous pass's findings."""
    i = int(wildcards.i)
    if i == 0:
        return {"policy": config["overflow"]["policy"]}
    previous = f"results/overflow/{wildcards.model}/iter{i - 1}"
    return {"policy": f"{previous}/policy_next.yaml", "previous": f"{previous}/findings.json"}


def overflow_iterations(wildcards):
    """Findings of every pass up to the first converged one (checkpoint walk, capped)."""
    import json

    files = []
    for i in range(config["overflow"]["max_iterations"]):
        findings = checkpoints.overflow_iteration.get(model=wildcards.model, i=i).output.findings
        files.append(findings)
        with open(findings) as handle:
            if json.load(handle)["converged"]:
                break
    return files


def overflow_final_policy(wildcards):
    """Policy after the last pass the walk reached."""
    return overflow_iterations(wildcards)[-1].replace("findings.json", "policy_next.yaml")


def overflow_case(key):
    """Per-model overflow setting (`inject` or `param_scale`) of the wildcard's model."""
    return lambda wildcards: config["overflow"][key].get(wildcards.model, [])


checkpoint overflow_iteration:
    input:
        unpack(overflow_iteration_inputs),
    output:
        findings="results/overflow/{model}/iter{i}/findings.json",
        policy="results/overflow/{model}/iter{i}/policy_next.yaml",
    log:
        "logs/overflow/{model}/iter{i}.log",
    benchmark:
        "benchmarks/overflow/{model}/iter{i}.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        iteration=lambda wildcards: int(wildcards.i),
        inject=overflow_case("inject"),
        param_scale=overflow_case("param_scale"),
        saturate=config["overflow"]["saturate"],
    threads: 1
    script:
        "../scripts/overflow_iteration.py"


rule overflow_summary:
    input:
        iterations=overflow_iterations,
        final_policy=overflow_final_policy,
        policy=config["overflow"]["policy"],
        nodes="results/export/{model}/nodes.parquet",
    output:
        summary="results/overflow/{model}/summary.json",
        policy="results/overflow/{model}/final_policy.yaml",
        precision="results/overflow/{model}/precision.parquet",
        findings="results/overflow/{model}/findings.parquet",
    log:
        "logs/overflow/{model}/summary.log",
    benchmark:
        "benchmarks/overflow/{model}/summary.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        inject=overflow_case("inject"),
        param_scale=overflow_case("param_scale"),
        max_iterations=config["overflow"]["max_iterations"],
        repeats=config["overflow"]["repeats"],
        warmup=config["overflow"]["warmup"],
    # Timing needs the machine to itself: take every core the run was given.
    threads: workflow.cores
    script:
        "../scripts/overflow_summary.py"


rule overflow_report:
    input:
        summaries=expand("results/overflow/{model}/summary.json", model=config["study"].get("overflow", [])),
    output:
        table="results/overflow/study.csv",
        plot=report(
            "results/plots/overflow/overflow.png",
            caption="../report/overflow.rst",
            category="Overflow",
            labels={"figure": "fp16 overflow loop"},
        ),
    log:
        "logs/overflow/report.log",
    script:
        "../scripts/overflow_report.py"
