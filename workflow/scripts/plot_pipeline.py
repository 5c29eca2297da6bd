"""Snakemake adapter: one pipeline step per rank (forward, backward, waiting) with predicted vs measured times."""

from trainplan.io import read_json
from trainplan.logs import log_to
from trainplan.pipeline.plot import plot_timeline

with log_to(snakemake.log[0]):
    plot_timeline(read_json(snakemake.input.run), snakemake.output[0])
