"""The one error type of the pipeline package."""


class PipelineError(ValueError):
    """A plan cannot run as a pipeline here; the message names the plan, stage, node or setting."""
