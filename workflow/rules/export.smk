# The graph is traced on the device type the step runs on ({backend}: cpu or cuda): a trace bakes
# device-specific kernels and factory devices into it.
rule export:
    output:
        nodes="results/export/{model}/{backend}/nodes.parquet",
        tensors="results/export/{model}/{backend}/tensors.parquet",
        summary="results/export/{model}/{backend}/graph.json",
        memory="results/export/{model}/{backend}/memory.parquet",
    log:
        "logs/export/{model}/{backend}.log",
    benchmark:
        "benchmarks/export/{model}/{backend}.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        fused_check=fused_check,
        code=code_version("export"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/export.py"


rule plot_memory:
    input:
        memory="results/export/{model}/{backend}/memory.parquet",
        summary="results/export/{model}/{backend}/graph.json",
    output:
        report(
            "results/plots/{model}/{backend}/memory.png",
            caption="../report/memory.rst",
            category="Export",
            subcategory="{model}",
            labels={"model": "{model}", "figure": "memory timeline"},
        ),
    log:
        "logs/plot_memory/{model}/{backend}.log",
    params:
        code=code_version("plot_memory"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/plot_memory.py"
