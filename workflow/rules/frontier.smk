# Memory/time frontier (docs/frontier.md): each method of `frontier.methods` trains the model in fresh processes,
# timed and metered alike; trainplan's plans and exports against PyTorch's own tools.


rule frontier:
    output:
        table="results/frontier/{model}/{device}/frontier.csv",
        verdicts="results/frontier/{model}/{device}/verdicts.json",
    log:
        "logs/frontier/{model}/{device}.log",
    benchmark:
        "benchmarks/frontier/{model}/{device}.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        device=device_spec,
        settings=config["frontier"],
        code=code_version("frontier"),
    # Timing needs the machine to itself: take every core the run was given.
    threads: workflow.cores
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/frontier.py"


rule plot_frontier:
    input:
        table="results/frontier/{model}/{device}/frontier.csv",
    output:
        report(
            "results/plots/{model}/{device}/frontier.png",
            caption="../report/frontier.rst",
            category="Frontier",
            subcategory="{model}",
            labels={"model": "{model}", "device": "{device}", "figure": "memory/time frontier"},
        ),
    log:
        "logs/plot_frontier/{model}/{device}.log",
    params:
        settings=config["frontier"],
        code=code_version("plot_frontier"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/plot_frontier.py"
