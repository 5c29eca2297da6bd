# Plans run as real pipelines (docs/pipeline_run.md): each k >= 2 plan as k torchrun processes, one stage each (k / v,
# v stages each, under Interleaved1F1B), under each schedule and micro-batch count of the `pipeline` block; measured
# against the balance rule's prediction.


# Our plan for each run: the balance rule's where its ranks' budgets hold what the run has in flight (1F1B with m
# between k and balance.micro_batches under balance.schedule 1f1b), else balanced here for the run's schedule and m.
rule pipeline_plan:
    input:
        unpack(traced_graph_inputs),
        profile="results/profile/{model}/{device}/ops.parquet",
        profile_summary="results/profile/{model}/{device}/summary.json",
        plan="results/balance/{model}/{device}/k{k}/b{budget}/plan.json",
    output:
        "results/pipeline/{model}/{device}/k{k}/b{budget}/plan_{schedule}_m{m}.json",
    log:
        "logs/pipeline_plan/{model}/{device}/k{k}/b{budget}/{schedule}_m{m}.log",
    benchmark:
        "benchmarks/pipeline_plan/{model}/{device}/k{k}/b{budget}/{schedule}_m{m}.tsv"
    params:
        balance=config["balance"],
        solver=config["solver"],
        memory_bytes=lambda wildcards: int(device_spec(wildcards)["memory_gib"] * 2**30),
        memory_model=device_memory_model,
        stages_per_rank=pipeline_placement,
        code=code_version("pipeline_plan"),
    threads: config["solver"]["workers"]
    wildcard_constraints:
        model=RAW_MODEL,
        k=PIPELINE_K,
        budget=BUDGET_WILDCARD,
        schedule=PIPELINE_SCHEDULE,
        m=r"[1-9][0-9]*",
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/pipeline_plan.py"


rule pipeline:
    input:
        plan="results/pipeline/{model}/{device}/k{k}/b{budget}/plan_{schedule}_m{m}.json",
    output:
        "results/pipeline/{model}/{device}/k{k}/b{budget}/{schedule}_m{m}.json",
    log:
        "logs/pipeline/{model}/{device}/k{k}/b{budget}/{schedule}_m{m}.log",
    benchmark:
        "benchmarks/pipeline/{model}/{device}/k{k}/b{budget}/{schedule}_m{m}.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        device=device_spec,
        settings=pipeline_settings("threads", "warmup", "repeats", "check", "tied_grads"),
        stages_per_rank=pipeline_placement,
        code=code_version("pipeline"),
    # Timing needs the machine to itself: take every core the run was given (k ranks x pipeline.threads each).
    threads: workflow.cores
    wildcard_constraints:
        model=RAW_MODEL,
        k=PIPELINE_K,
        budget=BUDGET_WILDCARD,
        schedule=PIPELINE_SCHEDULE,
        m=r"[1-9][0-9]*",
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/pipeline.py"


rule plot_pipeline:
    input:
        run="results/pipeline/{model}/{device}/k{k}/b{budget}/{schedule}_m{m}.json",
    output:
        report(
            "results/plots/{model}/{device}/k{k}/b{budget}/pipeline_{schedule}_m{m}.png",
            caption="../report/pipeline.rst",
            category="Pipeline",
            subcategory="{model}",
            labels={
                "model": "{model}",
                "k": "{k}",
                "budget": "{budget}",
                "schedule": "{schedule}",
                "m": "{m}",
                "figure": "per-rank timeline",
            },
        ),
    log:
        "logs/plot_pipeline/{model}/{device}/k{k}/b{budget}/{schedule}_m{m}.log",
    params:
        code=code_version("plot_pipeline"),
    wildcard_constraints:
        model=RAW_MODEL,
        k=PIPELINE_K,
        budget=BUDGET_WILDCARD,
        schedule=PIPELINE_SCHEDULE,
        m=r"[1-9][0-9]*",
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/plot_pipeline.py"


# The partitions a user would otherwise get (`pipeline.methods`: blocks split evenly, DeepSpeed's uniform and
# parameters methods, the exact DP) beside ours (the pipeline_plan rule's), each scheduled at the same budget for
# the same schedule and m, and run with them.
rule pipeline_methods:
    input:
        unpack(traced_graph_inputs),
        profile="results/profile/{model}/{device}/ops.parquet",
        profile_summary="results/profile/{model}/{device}/summary.json",
        plan="results/pipeline/{model}/{device}/k{k}/b{budget}/plan_{schedule}_m{m}.json",
    output:
        table="results/pipeline/{model}/{device}/k{k}/b{budget}/methods_{schedule}_m{m}.csv",
        runs=directory("results/pipeline/{model}/{device}/k{k}/b{budget}/methods_{schedule}_m{m}"),
    log:
        "logs/pipeline_methods/{model}/{device}/k{k}/b{budget}/{schedule}_m{m}.log",
    benchmark:
        "benchmarks/pipeline_methods/{model}/{device}/k{k}/b{budget}/{schedule}_m{m}.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        device=device_spec,
        settings=pipeline_settings("threads", "warmup", "repeats", "methods", "tied_grads"),
        balance=config["balance"],
        solver=config["solver"],
        memory_bytes=lambda wildcards: int(device_spec(wildcards)["memory_gib"] * 2**30),
        memory_model=device_memory_model,
        stages_per_rank=pipeline_placement,
        code=code_version("pipeline_methods"),
    # Timing needs the machine to itself: take every core the run was given (k ranks x pipeline.threads each).
    threads: workflow.cores
    wildcard_constraints:
        model=RAW_MODEL,
        k=PIPELINE_K,
        budget=BUDGET_WILDCARD,
        schedule=PIPELINE_SCHEDULE,
        m=r"[1-9][0-9]*",
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/pipeline_methods.py"


rule plot_pipeline_methods:
    input:
        table="results/pipeline/{model}/{device}/k{k}/b{budget}/methods_{schedule}_m{m}.csv",
    output:
        report(
            "results/plots/{model}/{device}/k{k}/b{budget}/pipeline_methods_{schedule}_m{m}.png",
            caption="../report/pipeline_methods.rst",
            category="Pipeline",
            subcategory="{model}",
            labels={
                "model": "{model}",
                "k": "{k}",
                "budget": "{budget}",
                "schedule": "{schedule}",
                "m": "{m}",
                "figure": "partition methods",
            },
        ),
    log:
        "logs/plot_pipeline_methods/{model}/{device}/k{k}/b{budget}/{schedule}_m{m}.log",
    params:
        code=code_version("plot_pipeline_methods"),
    wildcard_constraints:
        model=RAW_MODEL,
        k=PIPELINE_K,
        budget=BUDGET_WILDCARD,
        schedule=PIPELINE_SCHEDULE,
        m=r"[1-9][0-9]*",
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/plot_pipeline_methods.py"
