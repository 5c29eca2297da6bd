from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/export.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/partition.smk"
include: "workflow/rules/schedule.smk"
include: "workflow/rules/overflow.smk"
include: "workflow/rules/validate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/align.smk"
include: "workflow/rules/provenance.smk"
include: "workflow/rules/fuse.smk"
include: "workflow/rules/layout.smk"
include: "workflow/rules/frontier.smk"
include: "workflow/rules/pipeline.smk"


rule all:
    input:
        all_targets(),
    default_target: True
