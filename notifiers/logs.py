"""Logging set-up for the long-running processes (`ens serve`, `ens notifications deliver`,
`ens spark stream`): one record, one line.

A message that carries user text with a newline (a profile expression, an SMTP reply) would
otherwise split into lines that a log shipper reads as separate records; tracebacks stay
multi-line. httpx logs every request at INFO, which doubled each webhook delivery line (ours
says more): it logs warnings only.
"""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
QUIET = ("httpx", "httpcore")


class OneLineFormatter(logging.Formatter):
    """Escapes line breaks in the message (``\\n``), not in an appended traceback."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = record.message.replace("\r", "\\r").replace("\n", "\\n")
        return super().formatMessage(record)


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    for name in QUIET:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
