"""Provenance of a study (code, software, machine, config, seed: ``results/provenance.json``) and
``trainplan publish``: one archive of code, config and results that rebuilds the report elsewhere."""

from trainplan.provenance.archive import PublishError, publish
from trainplan.provenance.record import git_state, machine, provenance, versions

__all__ = ["PublishError", "git_state", "machine", "provenance", "publish", "versions"]
