"""fp16 DMA alignment padding (seed 001): per-op-class padding with fewer bytes than naive, proven by execution.

Typical use::

    from trainplan.align.classes import OpSpec
    from trainplan.align.plan import plan_op
    plan_op(OpSpec("x", "aten._softmax.default", "float16", {"self": (3, 5, 7, 9)}, args={"dim": -1}), 4)
"""
