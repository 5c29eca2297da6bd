# Stage 7 (seed 000): fp16 overflow loop. Each S1-S3 pass is one checkpoint job (cached per pass);
# the summary's input walks the passes until one converges or `overflow.max_iterations` is reached.
from trainplan.precision import paths as overflow_paths

OVERFLOW = config["overflow"]
OVERFLOW_CODE = [f"precision.{m}" for m in ("assign", "cases", "detect", "interpreter", "iterate", "policy")]


wildcard_constraints:
    i=r"\d+",


checkpoint overflow_iteration:
    input:
        unpack(lambda w: overflow_paths.iteration_inputs(w.model, int(w.i), study_file(OVERFLOW["policy"]))),
    output:
        findings="results/overflow/{model}/iter{i}/findings.json",
        policy="results/overflow/{model}/iter{i}/policy_next.yaml",
    log:
        "logs/overflow/{model}/iter{i}.log",
    benchmark:
        "benchmarks/overflow/{model}/iter{i}.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        iteration=lambda w: int(w.i),
        inject=lambda w: OVERFLOW["inject"].get(w.model, []),
        param_scale=lambda w: OVERFLOW["param_scale"].get(w.model, []),
        saturate=OVERFLOW["saturate"],
        emulate_matmul=OVERFLOW["emulate_matmul"],
        code=code_version("overflow_iteration"),
    threads: 1
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/overflow_iteration.py"


rule overflow_summary:
    input:
        iterations=lambda w: overflow_paths.walk_iterations(checkpoints.overflow_iteration, w.model, OVERFLOW["max_iterations"]),
        final_policy=lambda w: overflow_paths.final_policy(
            overflow_paths.walk_iterations(checkpoints.overflow_iteration, w.model, OVERFLOW["max_iterations"])[-1]
        ),
        policy=study_file(OVERFLOW["policy"]),
        nodes="results/export/{model}/cpu/nodes.parquet",  # the loop runs on the CPU
    output:
        summary="results/overflow/{model}/summary.json",
        policy="results/overflow/{model}/final_policy.yaml",
        precision="results/overflow/{model}/precision.parquet",
        findings="results/overflow/{model}/findings.parquet",
    log:
        "logs/overflow/{model}/summary.log",
    benchmark:
        "benchmarks/overflow/{model}/summary.tsv"
    params:
        spec=model_spec,
        seed=config["seed"],
        inject=lambda w: OVERFLOW["inject"].get(w.model, []),
        param_scale=lambda w: OVERFLOW["param_scale"].get(w.model, []),
        max_iterations=OVERFLOW["max_iterations"],
        repeats=OVERFLOW["repeats"],
        warmup=OVERFLOW["warmup"],
        emulate_matmul=OVERFLOW["emulate_matmul"],
        code=code_version("overflow_summary"),
    # Timing needs the machine to itself: take every core the run was given.
    threads: workflow.cores
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/overflow_summary.py"


rule overflow_report:
    input:
        summaries=expand("results/overflow/{model}/summary.json", model=config["study"]["overflow"]),
    output:
        table="results/overflow/study.csv",
        plot=report(
            "results/plots/overflow/overflow.png",
            caption="../report/overflow.rst",
            category="Overflow",
            subcategory="all models",
            labels={"figure": "fp16 overflow loop"},
        ),
    log:
        "logs/overflow/report.log",
    params:
        code=code_version("overflow_report"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/overflow_report.py"
