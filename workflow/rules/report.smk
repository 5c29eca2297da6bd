# Figures made for the report alone (each from artifacts other rules wrote): memory before and after the
# chosen plan, and each model's overflow passes and final lists.


rule plot_plan_memory:
    input:
        plan="results/balance/{model}/{device}/k{k}/b{budget}/plan.json",
        validation="results/validate/{model}/{device}/k{k}/b{budget}/validation.json",
        timeline="results/validate/{model}/{device}/k{k}/b{budget}/timeline.parquet",
    output:
        report(
            "results/plots/{model}/{device}/k{k}/b{budget}/plan_memory.png",
            caption="../report/plan_memory.rst",
            category="Memory plan",
            subcategory="{model}",
            labels={"model": "{model}", "k": "{k}", "budget": "{budget}", "figure": "memory before/after plan"},
        ),
    log:
        "logs/plot_plan_memory/{model}/{device}/k{k}/b{budget}.log",
    params:
        memory_model=device_memory_model,
        code=code_version("plot_plan_memory"),
    wildcard_constraints:
        k=r"[1-9][0-9]*",
        budget=BUDGET_WILDCARD,
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/plot_plan_memory.py"


rule plot_overflow_model:
    input:
        summary="results/overflow/{model}/summary.json",
        findings="results/overflow/{model}/findings.parquet",
        precision="results/overflow/{model}/precision.parquet",
    output:
        report(
            "results/plots/overflow/{model}/passes.png",
            caption="../report/overflow_model.rst",
            category="Overflow",
            subcategory="{model}",
            labels={"model": "{model}", "figure": "passes and final lists"},
        ),
    log:
        "logs/plot_overflow_model/{model}.log",
    params:
        code=code_version("plot_overflow_model"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/plot_overflow_model.py"
