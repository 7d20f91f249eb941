"""Access logs without query strings: a query can carry a secret (an API key pasted as `?key=`, a token in a link),
and access logs are kept, shipped and read far more widely than the API's own data.

`install()` puts the filter on the `uvicorn.access` logger of this process. The app factory calls it (uvicorn has
configured logging by then, in every process `--workers` starts), so each way of starting uvicorn is covered: the
Dockerfile's and docker-compose's command line, `python -m uvicorn` in the tests and benchmarks, and `kaudit serve`,
which also passes `log_config()` so the filter is part of its logging configuration from the start."""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

ACCESS_LOGGER = "uvicorn.access"
# uvicorn's access record: (client_addr, method, path with query string, http_version, status_code)
_ARGS = 5
_PATH = 2
_QUERY_IN_TEXT = re.compile(r"(/[^\s?\"]*)\?[^\s\"]*")


def strip_query(path: str) -> str:
    return path.split("?", 1)[0]


class ScrubQueryStrings(logging.Filter):
    """Drops the query string from each access record's path (the path itself is kept: it is what the log is for)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == _ARGS and isinstance(args[_PATH], str):
            record.args = (*args[:_PATH], strip_query(args[_PATH]), *args[_PATH + 1 :])
        elif not args and isinstance(record.msg, str):  # a line formatted before it was logged
            record.msg = _QUERY_IN_TEXT.sub(r"\1", record.msg)
        return True


def install(logger_name: str = ACCESS_LOGGER) -> None:
    """Idempotent: one filter per logger however many apps this process builds."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, ScrubQueryStrings) for f in logger.filters):
        logger.addFilter(ScrubQueryStrings())


def log_config() -> dict[str, Any]:
    """uvicorn's default logging configuration with the filter on its access logger."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["scrub_query_strings"] = {"()": f"{__name__}.ScrubQueryStrings"}
    config["loggers"][ACCESS_LOGGER].setdefault("filters", []).append("scrub_query_strings")
    return config
