"""Log lines about a request carry its request id, graph and node.

Code that logs about a request passes them as ``extra={"request_id": ..., "graph": ...,
"node": ...}``; :class:`RequestFormatter` appends them as ``key=value`` pairs (and the JSON
form writes one object per line), so a failing node can be found in the logs by request.
"""

from __future__ import annotations

import json
import logging

REQUEST_FIELDS = ("request_id", "graph", "node")


class RequestFormatter(logging.Formatter):
    """``time level logger: message [request_id=... graph=... node=...]``."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = [f"{k}={getattr(record, k)}" for k in REQUEST_FIELDS if getattr(record, k, None)]
        return f"{text} [{' '.join(fields)}]" if fields else text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the request fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in REQUEST_FIELDS:
            value = getattr(record, key, None)
            if value:
                doc[key] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def configure(level: str, json_lines: bool = False) -> None:
    handler = logging.StreamHandler()
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler.setFormatter(JsonFormatter() if json_lines else RequestFormatter(fmt))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
