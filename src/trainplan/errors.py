"""Errors raised where the package is imported without torch: an artifact reader's, and a bad model entry's."""


class ArtifactError(RuntimeError):
    """An artifact is missing, unreadable or does not have the expected content."""


class ModelSpecError(ValueError):
    """A model entry in the config cannot be built; the message names the model and the key."""
