"""The errors a planned module raises on a budget or a batch it cannot train under as asked."""


class InfeasibleBudgetError(ValueError):
    """No schedule of the step was found within the requested budget; the message names it, the least budget
    reached and whether the requested one is proven infeasible."""


class NewBatchShapeError(ValueError):
    """A batch whose keys, shapes or dtypes differ from the planned one, with ``on_new_shape="raise"``; the
    message names the key and both shapes."""
