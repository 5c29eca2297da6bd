rule partition:
    input:
        unpack(traced_graph_inputs),
        profile="results/profile/{model}/{device}/ops.parquet",
    output:
        "results/partition/{model}/{device}/k{k}/partition.json",
    log:
        "logs/partition/{model}/{device}/k{k}.log",
    benchmark:
        "benchmarks/partition/{model}/{device}/k{k}.tsv"
    params:
        k=lambda wildcards: int(wildcards.k),
        tolerance=config["balance"]["tolerance"],
        micro_batches=config["balance"]["micro_batches"],
        pipeline_schedule=config["balance"]["schedule"],
        memory_bytes=lambda wildcards: int(device_spec(wildcards)["memory_gib"] * 2**30),
        code=code_version("partition"),
    wildcard_constraints:
        k=r"[1-9][0-9]*",
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/partition.py"


rule balance:
    input:
        unpack(traced_graph_inputs),
        profile="results/profile/{model}/{device}/ops.parquet",
        profile_summary="results/profile/{model}/{device}/summary.json",
        partition="results/partition/{model}/{device}/k{k}/partition.json",
        schedules="results/schedule/{model}/{device}/k{k}/b{budget}/schedules.json",
    output:
        plan="results/balance/{model}/{device}/k{k}/b{budget}/plan.json",
        iterations="results/balance/{model}/{device}/k{k}/b{budget}/iterations.json",
    log:
        "logs/balance/{model}/{device}/k{k}/b{budget}.log",
    benchmark:
        "benchmarks/balance/{model}/{device}/k{k}/b{budget}.tsv"
    params:
        memory_bytes=lambda wildcards: int(device_spec(wildcards)["memory_gib"] * 2**30),
        balance=config["balance"],
        solver=config["solver"],
        memory_model=device_memory_model,
        code=code_version("balance"),
    threads: config["solver"]["workers"]
    wildcard_constraints:
        k=r"[1-9][0-9]*",
        budget=BUDGET_WILDCARD,
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/balance.py"


rule plot_balance:
    input:
        iterations="results/balance/{model}/{device}/k{k}/b{budget}/iterations.json",
    output:
        report(
            "results/plots/{model}/{device}/k{k}/b{budget}/balance.png",
            caption="../report/partition_balance.rst",
            category="Balance",
            subcategory="{model}",
            labels={"model": "{model}", "k": "{k}", "budget": "{budget}", "figure": "stage times"},
        ),
    log:
        "logs/plot_balance/{model}/{device}/k{k}/b{budget}.log",
    params:
        code=code_version("plot_balance"),
    wildcard_constraints:
        k=r"[1-9][0-9]*",
        budget=BUDGET_WILDCARD,
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/plot_balance.py"
