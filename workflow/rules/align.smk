# Stage 8 (seed 001): fp16 DMA alignment padding per op class, vs naive every-dimension padding, over
# every model of the study, with the precision of each op from the overflow stage's final policy
# (the starting policy for a model without an overflow run); proven by padded training steps.
ALIGN = config["align"]
ALIGN_CODE = [f"align.{m}" for m in ("units", "problem", "classes", "plan", "graph", "study")]


rule align:
    input:
        policy=align_policy,
    output:
        plan="results/align/{model}/plan.json",
        ops="results/align/{model}/ops.parquet",
        summary="results/align/{model}/summary.json",
    log:
        "logs/align/{model}/plan.log",
    benchmark:
        "benchmarks/align/{model}/plan.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        granularity=ALIGN["granularity_bytes"],
        dtypes=ALIGN["dtypes"],
        matmul_rule=ALIGN["matmul_rule"],
        code=code_version("align"),
    threads: 1
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/align.py"


rule align_prove:
    input:
        policy=align_policy,
    output:
        proof="results/align/{model}/proof.parquet",
        steps="results/align/{model}/steps.json",
    log:
        "logs/align/{model}/prove.log",
    benchmark:
        "benchmarks/align/{model}/prove.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        granularity=ALIGN["granularity_bytes"],
        granularities=ALIGN["prove_granularities"],
        matmul_rule=ALIGN["matmul_rule"],
        prove_inputs=lambda w: ALIGN["prove_inputs"].get(w.model, {}),
        repeats=ALIGN["repeats"],
        warmup=ALIGN["warmup"],
        code=code_version("align_prove"),
    # Timing the padding copies needs the machine to itself: take every core the run was given.
    threads: workflow.cores
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/align_prove.py"


rule align_report:
    input:
        summaries=expand("results/align/{model}/summary.json", model=ALIGN_MODELS),
        steps=expand("results/align/{model}/steps.json", model=ALIGN_MODELS),
    output:
        table="results/align/study.csv",
        plot=report(
            "results/plots/align/align.png",
            caption="../report/align.rst",
            category="Alignment",
            labels={"figure": "fp16 alignment padding"},
        ),
    log:
        "logs/align/report.log",
    params:
        code=code_version("align_report"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/align_report.py"
