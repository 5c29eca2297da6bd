"""Snakemake adapter: results/provenance.json (git state, versions, machine, resolved config, seeds, digests)."""

from pathlib import Path

from trainplan.io import write_json
from trainplan.logs import log_to
from trainplan.provenance import git_state, provenance

with log_to(snakemake.log[0]) as log:
    repo = Path(snakemake.scriptdir).parents[1]  # workflow/scripts/ -> the workflow's code
    record = provenance(dict(snakemake.params.config), git_state(repo), "results", snakemake.output[0])
    log.info("commit %s (dirty: %s), %d result files", record["git"]["commit"], record["git"]["dirty"],
             len(record["results"]))
    write_json(snakemake.output[0], record)
