rule layout_sweep:
    output:
        table="results/layout/sweep/{device}/sweep.parquet",
    log:
        "logs/layout/sweep/{device}.log",
    benchmark:
        "benchmarks/layout/sweep/{device}.tsv"
    params:
        settings=layout_settings(
            "sweep", "batch_size", "image_size", "layouts", "repeats", "calls", "warmup", "threads", "clock"
        ),
        device_type=lambda wildcards: backend_of(wildcards.device),
        seed=config["seed"],
        code=code_version("layout_sweep"),
    # Timing needs the machine to itself: take every core the run was given.
    threads: workflow.cores
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/layout_sweep.py"


rule layout_measure:
    output:
        convs="results/layout/{model}/{device}/convs.parquet",
        groups="results/layout/{model}/{device}/groups.parquet",
        edges="results/layout/{model}/{device}/edges.parquet",
        problem="results/layout/{model}/{device}/problem.json",
    log:
        "logs/layout/measure/{model}/{device}.log",
    benchmark:
        "benchmarks/layout/measure/{model}/{device}.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        settings=layout_settings("batch_size", "image_size", "layouts", "repeats", "calls", "warmup", "threads", "clock"),
        device_type=lambda wildcards: backend_of(wildcards.device),
        code=code_version("layout_measure"),
    # Timing needs the machine to itself: take every core the run was given.
    threads: workflow.cores
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/layout_measure.py"


rule layout:
    input:
        unpack(layout_measurements),
        sweep="results/layout/sweep/{device}/sweep.parquet",
    output:
        plan="results/layout/{model}/{device}/plan.json",
        execution="results/layout/{model}/{device}/execution.json",
        predictions="results/layout/{model}/{device}/predictions.csv",
    log:
        "logs/layout/plan/{model}/{device}.log",
    benchmark:
        "benchmarks/layout/plan/{model}/{device}.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        settings=layout_settings("layouts", "batch_size", "image_size", "step_repeats", "warmup", "threads", "clock", "tolerances"),
        device_type=lambda wildcards: backend_of(wildcards.device),
        solver=config["solver"],
        code=code_version("layout"),
    # Timing needs the machine to itself: take every core the run was given.
    threads: workflow.cores
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/layout.py"


rule layout_io:
    input:
        convs="results/layout/{model}/{device}/convs.parquet",
    output:
        io="results/layout/{model}/{device}/io.csv",
    log:
        "logs/layout/io/{model}/{device}.log",
    benchmark:
        "benchmarks/layout/io/{model}/{device}.tsv"
    params:
        io=config["layout"]["io"],
        code=code_version("layout_io"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/layout_io.py"


rule plot_layout:
    input:
        predictions="results/layout/{model}/{device}/predictions.csv",
        execution="results/layout/{model}/{device}/execution.json",
    output:
        report(
            "results/plots/layout/{model}/{device}/layout.png",
            caption="../report/layout.rst",
            category="Layout",
            labels={"model": "{model}", "figure": "per-layer layouts and step time"},
        ),
    log:
        "logs/plot_layout/{model}/{device}.log",
    params:
        code=code_version("plot_layout"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/plot_layout.py"


rule layout_summary:
    input:
        plans=layout_files("plan.json"),
        executions=layout_files("execution.json"),
        predictions=layout_files("predictions.csv"),
        io=layout_files("io.csv"),
    output:
        table=report(
            "results/layout/{device}/summary.csv",
            caption="../report/layout_summary.rst",
            category="Layout",
            labels={"figure": "summary table"},
        ),
        figure=report(
            "results/plots/layout/{device}/summary.png",
            caption="../report/layout_summary.rst",
            category="Layout",
            labels={"figure": "study summary"},
        ),
    log:
        "logs/layout/summary/{device}.log",
    params:
        code=code_version("layout_summary"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/layout_summary.py"
