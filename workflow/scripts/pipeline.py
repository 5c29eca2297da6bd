"""Snakemake adapter: run one k-stage plan as a pipeline (trainplan.pipeline: one torchrun process per stage, or
per v stages under Interleaved1F1B, the ranks' output in this rule's log)."""

import sys
from pathlib import Path

from trainplan.execute.plan import load_plan
from trainplan.logs import log_to
from trainplan.pipeline.errors import PipelineError
from trainplan.pipeline.launch import launch
from trainplan.pipeline.run import RunSettings, check_settings

with log_to(snakemake.log[0]) as log:
    inp, par, wc = snakemake.input, snakemake.params, snakemake.wildcards
    data, _ = load_plan(inp.plan)
    keys = ("warmup", "threads", "check", "repeats", "tied_grads")
    settings = RunSettings(Path(inp.plan), wc.model, dict(par.spec), wc.schedule, int(wc.m), Path(snakemake.output[0]),
                           par.seed, device=par.device["type"], stages_per_rank=int(par.stages_per_rank),
                           **{key: par.settings[key] for key in keys})
    check_settings(settings, data, None)
    k = len(data["stages"])
    ranks = settings.ranks(k)
    if ranks * settings.threads > snakemake.threads:
        log.warning("%d ranks x %d thread(s) each exceed the %d core(s) this job has: ranks share cores, and the "
                    "measured times include waiting for one", ranks, settings.threads, snakemake.threads)
    log.info("model '%s': k=%d on %d ranks, %s, m=%s, %d measured step(s) after %d warm-up step(s)", wc.model, k,
             ranks, wc.schedule, wc.m, settings.repeats, settings.warmup)
    sys.stderr.flush()
    code = launch(settings, ranks, output=sys.stderr)
    if code != 0:
        raise PipelineError(f"model '{wc.model}', plan {inp.plan}: a rank failed (torchrun exit {code}); its "
                            f"message is above in {snakemake.log[0]}")
