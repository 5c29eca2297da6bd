rule schedule:
    input:
        unpack(traced_graph_inputs),
        profile="results/profile/{model}/{device}/ops.parquet",
        profile_summary="results/profile/{model}/{device}/summary.json",
        partition="results/partition/{model}/{device}/k{k}/partition.json",
    output:
        schedules="results/schedule/{model}/{device}/k{k}/b{budget}/schedules.json",
        table="results/schedule/{model}/{device}/k{k}/b{budget}/compare.csv",
    log:
        "logs/schedule/{model}/{device}/k{k}/b{budget}.log",
    benchmark:
        "benchmarks/schedule/{model}/{device}/k{k}/b{budget}.tsv"
    params:
        time_limit_s=config["solver"]["time_limit_s"],
        workers=config["solver"]["workers"],
        seed=config["solver"]["seed"],
        memory_model=device_memory_model,
        micro_batches=config["balance"]["micro_batches"],
        pipeline_schedule=config["balance"]["schedule"],
        code=code_version("schedule"),
    threads: config["solver"]["workers"]
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/schedule.py"


rule schedule_summary:
    input:
        tables=schedule_tables,
    output:
        table="results/schedule/{model}/{device}/k{k}/compare.csv",
        plot=report(
            "results/plots/{model}/{device}/k{k}/schedule_overhead.png",
            caption="../report/schedule_overhead.rst",
            category="Schedule",
            subcategory="{model}",
            labels={"model": "{model}", "stages": "{k}", "figure": "overhead vs memory"},
        ),
    log:
        "logs/schedule_summary/{model}/{device}/k{k}.log",
    params:
        code=code_version("schedule_summary"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/schedule_summary.py"
