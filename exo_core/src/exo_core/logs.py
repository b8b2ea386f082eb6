"""Logging: loguru to stderr and to a rotating file in the data directory."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from loguru import logger


class _InterceptHandler(logging.Handler):
    """Send stdlib logging (uvicorn, litestar, huggingface_hub) through loguru."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        logger.opt(depth=6, exception=record.exc_info).log(level, record.getMessage())


def setup_logging(verbosity: int, data_dir: Path | None) -> None:
    level = "DEBUG" if verbosity > 0 else "WARNING" if verbosity < 0 else "INFO"
    logger.remove()
    time_format = "YYYY-MM-DD HH:mm:ss.SSS" if verbosity > 0 else "HH:mm:ss.SSS"
    logger.add(
        sys.stderr,
        level=level,
        # No values of local variables in tracebacks: they hold prompts and keys.
        diagnose=False,
        format=f"<green>{{time:{time_format}}}</green> <level>{{level: <7}}</level> {{message}}",
    )
    if data_dir is not None:
        logs = data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        logger.add(
            logs / "exo.log",
            level="DEBUG" if verbosity > 0 else "INFO",
            rotation="20 MB",
            retention=5,
            enqueue=True,
            diagnose=False,
            format="{time:YYYY-MM-DD HH:mm:ss.SSS} {level: <7} {process} {message}",
        )
    logging.basicConfig(handlers=[_InterceptHandler()], level=logging.INFO, force=True)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "litestar"):
        logging.getLogger(name).handlers = [_InterceptHandler()]
        logging.getLogger(name).propagate = False
    logging.getLogger("uvicorn.access").setLevel(
        logging.DEBUG if verbosity > 0 else logging.WARNING
    )
    logger.info(f"===== starting exo (pid {os.getpid()}) =====")
