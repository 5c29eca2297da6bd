"""The one error type of the fuse package."""


class FuseError(ValueError):
    """A graph, support table or grouping is invalid; the message names the node, op, group or file."""
