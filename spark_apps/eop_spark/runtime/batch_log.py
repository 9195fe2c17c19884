"""The runner's logs: plain text or JSON lines, and one structured line per batch.

Every committed (or skipped) batch is reported as one ``batch`` event with
its id, commit mode, rows in and out, the offsets committed to the progress
group, the transaction time and whether the sink found it already visible
(a replay).  With ``--log-format json`` each log record is one JSON object,
fields at the top level, so a log pipeline can graph them without parsing.

Logs go to stdout; stderr carries only the final error line, if any.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from eop_spark.exactly_once.batch_result import BatchResult

BATCH_EVENT = "batch"


def log_batch(logger: logging.Logger, result: BatchResult) -> None:
    """Emit the one log line of a finished batch."""
    f = result.fields()
    logger.info(
        "batch %d %s (%s): rows in %s, out %d, offsets %s, txn %.1f ms",
        result.batch_id,
        result.status,
        result.mode,
        "?" if result.rows_in is None else result.rows_in,
        result.rows_out,
        f["offsets"],
        result.txn_ms,
        extra={"event": BATCH_EVENT, "fields": f},
    )


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, and the record's ``fields``."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as a JSON line."""
        data: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        event = getattr(record, "event", None)
        if event:
            data["event"] = event
        data.update(getattr(record, "fields", {}))
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def configure_logging(log_format: str) -> None:
    """Send the runner's logs (and librdkafka's) to stdout in ``text`` or ``json`` format."""
    handler = logging.StreamHandler(sys.stdout)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    # py4j logs every gateway call at INFO; librdkafka's own chatter is warnings and up.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("eop_spark.librdkafka").setLevel(logging.WARNING)
    # Library warnings (pandas/pyarrow versions...) are log lines too, not stderr noise.
    logging.captureWarnings(True)
