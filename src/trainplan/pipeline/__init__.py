"""Run a k-stage plan as a real pipeline: one ``torchrun`` process per stage, each stage split at its
forward/backward boundary (:mod:`~trainplan.pipeline.split`) and wrapped as an autograd Function
(:mod:`~trainplan.pipeline.stage`) that ``torch.distributed.pipelining``'s PipelineStage and GPipe/1F1B schedules
run unchanged; measured per rank against the balance rule's prediction (:mod:`~trainplan.pipeline.run`), launched
with torchrun (:mod:`~trainplan.pipeline.launch`, :mod:`~trainplan.pipeline.worker`), drawn per rank
(:mod:`~trainplan.pipeline.plot`), and other partition methods run the same way (:mod:`~trainplan.pipeline.compare`).
"""

from trainplan.pipeline.errors import PipelineError

__all__ = ["PipelineError"]
