rule export:
    output:
        nodes="results/export/{model}/nodes.parquet",
        tensors="results/export/{model}/tensors.parquet",
        summary="results/export/{model}/graph.json",
        memory="results/export/{model}/memory.parquet",
    log:
        "logs/export/{model}.log",
    benchmark:
        "benchmarks/export/{model}.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        code=code_version("models", "trace", "export", "memory"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/export.py"


rule plot_memory:
    input:
        memory="results/export/{model}/memory.parquet",
        summary="results/export/{model}/graph.json",
    output:
        report(
            "results/plots/{model}/memory.png",
            caption="../report/memory.rst",
            category="Export",
            labels={"model": "{model}", "figure": "memory timeline"},
        ),
    log:
        "logs/plot_memory/{model}.log",
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/plot_memory.py"
