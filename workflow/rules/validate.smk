rule validate:
    input:
        unpack(traced_graph_inputs),
        plan="results/balance/{model}/{device}/k{k}/b{budget}/plan.json",
        profile_summary="results/profile/{model}/{device}/summary.json",
    output:
        validation="results/validate/{model}/{device}/k{k}/b{budget}/validation.json",
        timeline="results/validate/{model}/{device}/k{k}/b{budget}/timeline.parquet",
    log:
        "logs/validate/{model}/{device}/k{k}/b{budget}.log",
    benchmark:
        "benchmarks/validate/{model}/{device}/k{k}/b{budget}.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        device=device_spec,
        settings=config["validate"],
        code=code_version("validate"),
    # Timing needs the machine to itself: take every core the run was given.
    threads: workflow.cores
    wildcard_constraints:
        k=r"[1-9][0-9]*",
        budget=BUDGET_WILDCARD,
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/validate.py"


rule plot_validate:
    input:
        validation="results/validate/{model}/{device}/k{k}/b{budget}/validation.json",
        timeline="results/validate/{model}/{device}/k{k}/b{budget}/timeline.parquet",
    output:
        report(
            "results/plots/{model}/{device}/k{k}/b{budget}/validation.png",
            caption="../report/validate.rst",
            category="Validate",
            subcategory="{model}",
            labels={"model": "{model}", "k": "{k}", "budget": "{budget}", "figure": "predicted vs measured"},
        ),
    log:
        "logs/plot_validate/{model}/{device}/k{k}/b{budget}.log",
    params:
        memory_model=device_memory_model,
        code=code_version("plot_validate"),
    wildcard_constraints:
        k=r"[1-9][0-9]*",
        budget=BUDGET_WILDCARD,
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/plot_validate.py"


rule validate_summary:
    input:
        validation_files(),
    output:
        table=report(
            "results/validate/summary.csv",
            caption="../report/validate_summary.rst",
            category="Validate",
            subcategory="all models",
            labels={"figure": "summary table"},
        ),
    log:
        "logs/validate/summary.log",
    params:
        memory_models={device: memory_model_of(device) for device in DEVICES},
        code=code_version("validate_summary"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/validate_summary.py"
