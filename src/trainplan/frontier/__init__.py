"""Memory/time frontier: trainplan's plans and their exports against PyTorch's own memory tools, each method
trained in a fresh process and measured on one meter (docs/frontier.md)."""
