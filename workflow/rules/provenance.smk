# What produced the study: written after every other result (its input), so rerun whenever one of them
# or the config changes; it records the code's git state at that time. `trainplan publish` archives it.


rule provenance:
    input:
        [target for target in all_targets() if target != "results/provenance.json"],
    output:
        report(
            "results/provenance.json",
            caption="../report/provenance.rst",
            category="Provenance",
            labels={"figure": "code, software, machine, config"},
        ),
    log:
        "logs/provenance.log",
    params:
        config=config,
        code=code_version("provenance"),
    conda:
        "../envs/trainplan.yaml"
    script:
        "../scripts/provenance.py"
