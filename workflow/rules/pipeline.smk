# Plans run as real pipelines (docs/pipeline_run.md): each k >= 2 plan as k torchrun processes, one stage each,
# under each schedule and micro-batch count of the `pipeline` block; measured against the balance rule's prediction.


rule pipeline:
    input:
        plan="results/balance/{model}/{device}/k{k}/b{budget}/plan.json",
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
        settings=pipeline_settings("threads", "warmup", "repeats", "check"),
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

