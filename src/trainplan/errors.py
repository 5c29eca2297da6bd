"""The error every artifact reader raises: a missing, unreadable or malformed artifact, named in the message."""


class ArtifactError(RuntimeError):
    """An artifact is missing, unreadable or does not have the expected content."""
