"""Export a training step: trace it (``trace``), tabulate its ops and tensors (``tables``) and the bytes live
while each op runs (``memory``). Imports nothing itself: ``memory`` serves the solver rules without torch."""
