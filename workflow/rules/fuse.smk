# The seed's rule on the forward graph (a fused op is a forward kernel whose backward autograd derives); the
# exported step gives its ops' module paths, the profile their times.
rule fuse:
    input:
        unpack(traced_graph_inputs),
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
        spec=model_spec,
        seed=config["seed"],
        target=lambda wildcards: config["fuse"]["targets"][wildcards.target],  # the table file is an input
        device_type=lambda wildcards: backend_of(wildcards.device),
        fx_max_nodes=config["fuse"]["fx_max_nodes"],
        code=code_version("fuse"),
    wildcard_constraints:
        target=FUSE_TARGET,
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/fuse.py"


# Forward groups compiled as inference kernels (no autograd) and timed against their ops.
rule fuse_measure:
    input:
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
        code=code_version("fuse_measure"),
    # Timing needs the machine to itself: take every core the run was given.
    threads: workflow.cores
    wildcard_constraints:
        target=FUSE_TARGET,
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/fuse_measure.py"


# The training step with fused ops: the seed's rule on the forward graph, each group compiled by Inductor with
# autograd, timed against eager and Inductor on the whole forward in alternating rounds.
rule fuse_train:
    input:
        table=fuse_table_files,
    output:
        summary="results/fuse/{model}/{device}/{target}/train_step.json",
        groups="results/fuse/{model}/{device}/{target}/train_groups.parquet",
    log:
        "logs/fuse_train/{model}/{device}/{target}.log",
    benchmark:
        "benchmarks/fuse_train/{model}/{device}/{target}.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        target=lambda wildcards: config["fuse"]["targets"][wildcards.target],  # the table file is an input
        device_type=lambda wildcards: backend_of(wildcards.device),
        settings=config["fuse"]["train"],
        code=code_version("fuse_train"),
    # Timing needs the machine to itself: take every core the run was given.
    threads: workflow.cores
    wildcard_constraints:
        target=FUSE_TARGET,
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/fuse_train.py"


rule plot_fuse_train:
    input:
        summary="results/fuse/{model}/{device}/{target}/train_step.json",
        groups="results/fuse/{model}/{device}/{target}/train_groups.parquet",
    output:
        report(
            "results/plots/{model}/{device}/fuse_train_{target}.png",
            caption="../report/fuse_train.rst",
            category="Fusion",
            labels={"model": "{model}", "target": "{target}", "figure": "training step with fused ops"},
        ),
    log:
        "logs/plot_fuse_train/{model}/{device}/{target}.log",
    params:
        code=code_version("plot_fuse_train"),
    wildcard_constraints:
        target=FUSE_TARGET,
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/plot_fuse_train.py"


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
    params:
        code=code_version("plot_fuse"),
    wildcard_constraints:
        target=FUSE_TARGET,
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/plot_fuse.py"


# Plans on the fused models '<model>+<target>' (fuse.plan: exported, profiled, partitioned, scheduled, balanced and
# validated as any model) next to the raw models' plans.
rule fuse_plan_compare:
    input:
        unpack(fuse_plan_inputs),
    output:
        table="results/fuse/{device}/plan_compare.csv",
        plot=report(
            "results/plots/fuse/{device}/plan_compare.png",
            caption="../report/fuse_plan.rst",
            category="Fusion",
            labels={"model": "all planned", "target": ", ".join(config["fuse"]["plan"]), "figure": "plans: fused vs raw graph"},
        ),
    log:
        "logs/fuse_plan_compare/{device}.log",
    params:
        cases=fuse_plan_cases(),
        code=code_version("fuse_plan_compare"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/fuse_plan_compare.py"
