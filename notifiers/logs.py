"""Logging set-up for the long-running processes (`ens serve`, `ens notifications deliver`,
`ens spark stream`): one record, one line.

A message that carries user text with a newline (a profile expression, an SMTP reply) would
otherwise split into lines that a log shipper reads as separate records; tracebacks stay
multi-line. httpx logs every request at INFO, which doubled each webhook delivery line (ours
says more): it logs warnings only.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
QUIET = ("httpx", "httpcore")


class OneLineFormatter(logging.Formatter):
    """Escapes line breaks in the message (``\\n``), not in an appended traceback."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = record.message.replace("\r", "\\r").replace("\n", "\\n")
        return super().formatMessage(record)


# What every LogRecord has; anything else on a record came as ``extra=`` and is written too.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601 with ms), ``level``, ``logger``,
    ``message``, the record's extra fields, and ``exception`` with a traceback. JSON escapes
    line breaks, so a record is one line whatever it carries."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC)
        out: dict[str, object] = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out.setdefault(key, value)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def setup_logging(level: str, force: bool = False, log_format: str = "text") -> None:
    """``force``: replace the root logger's handlers (`ens serve`, a process of its own); else,
    as `logging.basicConfig`, only a process whose root logger has none gets ours (a command run
    inside another program, or a test, keeps that program's). ``log_format``: ``text`` or
    ``json`` (`JsonFormatter`)."""
    handler = logging.StreamHandler(sys.stderr)
    fmt = JsonFormatter() if log_format == "json" else OneLineFormatter(FORMAT)
    handler.setFormatter(fmt)
    logging.basicConfig(level=level.upper(), handlers=[handler], force=force)
    for name in QUIET:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
