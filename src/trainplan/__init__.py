"""trainplan: plan memory, pipeline stages and precision of a PyTorch training step."""

__version__ = "0.1.0"
