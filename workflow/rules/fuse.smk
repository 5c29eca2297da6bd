rule fuse:
    input:
        unpack(export_inputs),
        profile="results/profile/{model}/{device}/ops.parquet",
        table=fuse_table_files,
    output:
        groups="results/fuse/{model}/{device}/{target}/groups.json",
        table="results/fuse/{model}/{device}/{target}/groups.parquet",
        compare="results/fuse/{model}/{device}/{target}/compare.csv",
    log:
        "logs/fuse/{model}/{device}/{target}.log",
    benchmark:
        "benchmarks/fuse/{model}/{device}/{target}.tsv"
    params:
        target=lambda wildcards: config["fuse"]["targets"][wildcards.target],  # the table file is an input
        fx_max_nodes=config["fuse"]["fx_max_nodes"],
        code=code_version(
            "fuse.graph", "fuse.support", "fuse.prune", "fuse.merge", "fuse.partitioner", "fuse.baselines",
            "fuse.coverage", "fuse.exported", "fuse.stage",
        ),
    wildcard_constraints:
        target=FUSE_TARGET,
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/fuse.py"


rule fuse_measure:
    input:
        unpack(export_inputs),
        groups="results/fuse/{model}/{device}/{target}/groups.json",
        table="results/fuse/{model}/{device}/{target}/groups.parquet",
    output:
        summary="results/fuse/{model}/{device}/{target}/measure.json",
        groups="results/fuse/{model}/{device}/{target}/measure.parquet",
    log:
        "logs/fuse_measure/{model}/{device}/{target}.log",
    benchmark:
        "benchmarks/fuse_measure/{model}/{device}/{target}.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        settings=config["fuse"]["measure"],
        code=code_version("models", "trace", "fuse.measure"),
    # Timing needs the machine to itself: take every core the run was given.
    threads: workflow.cores
    wildcard_constraints:
        target=FUSE_TARGET,
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/fuse_measure.py"


rule plot_fuse:
    input:
        groups="results/fuse/{model}/{device}/{target}/groups.parquet",
        compare="results/fuse/{model}/{device}/{target}/compare.csv",
        measure=fuse_measure_files,
    output:
        report(
            "results/plots/{model}/{device}/fuse_{target}.png",
            caption="../report/fuse.rst",
            category="Fusion",
            labels={"model": "{model}", "target": "{target}", "figure": "fusion groups"},
        ),
    log:
        "logs/plot_fuse/{model}/{device}/{target}.log",
    wildcard_constraints:
        target=FUSE_TARGET,
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/plot_fuse.py"
