rule profile:
    input:
        unpack(traced_graph_inputs),
    output:
        ops="results/profile/{model}/{device}/ops.parquet",
        summary="results/profile/{model}/{device}/summary.json",
    log:
        "logs/profile/{model}/{device}.log",
    benchmark:
        "benchmarks/profile/{model}/{device}.tsv"
    params:
        spec=model_spec,
        device=device_spec,
        seed=config["seed"],
        repeats=config["profile"]["repeats"],
        warmup=config["profile"]["warmup"],
        torch_threads=config["profile"]["threads"],
        code=code_version("profile"),
    # Timing needs the machine to itself: take every core the run was given.
    threads: workflow.cores
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/profile.py"


rule plot_profile:
    input:
        ops="results/profile/{model}/{device}/ops.parquet",
        summary="results/profile/{model}/{device}/summary.json",
        nodes=lambda w: graph_files(w.model, backend_of(w.device))["nodes"],
    output:
        report(
            "results/plots/{model}/{device}/op_time.png",
            caption="../report/op_time.rst",
            category="Profile",
            subcategory="{model}",
            labels={"model": "{model}", "figure": "per-op time"},
        ),
    log:
        "logs/plot_profile/{model}/{device}.log",
    params:
        code=code_version("plot_profile"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/plot_profile.py"
