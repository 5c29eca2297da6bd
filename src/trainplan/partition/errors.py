"""The one error type of the partition package."""


class PartitionError(ValueError):
    """A graph, stage count or memory limit admits no pipeline partition; the message names the node or stage."""
