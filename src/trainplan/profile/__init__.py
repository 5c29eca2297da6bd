"""Profile a traced training step on its device: each op's time and recompute time (``op_times``), and the
host link's bandwidth that prices a swap (``link``)."""
