"""Per-rule logging: send stderr and the logging module to the rule's log file."""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def log_to(path: str) -> Iterator[logging.Logger]:
    """Redirect stderr and logging to ``path`` for the duration of a rule's script."""
    with open(path, "w", buffering=1) as handle:
        old = sys.stderr
        sys.stderr = handle
        logging.basicConfig(stream=handle, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True)
        try:
            yield logging.getLogger("trainplan")
        except Exception as exc:
            logging.getLogger("trainplan").error("%s: %s", type(exc).__name__, exc)
            raise
        finally:
            sys.stderr = old
