"""The native module's `tracing` events reach Python's `logging` (logger
`nixl_connect`), with Python's level numbers, only when that logger is enabled
for them; nothing is printed where logging is not configured."""

import logging
import subprocess
import sys
import time
import uuid

import nixl_connect as nc
from conftest import require_backend, run

LOGGER = logging.getLogger("nixl_connect")


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.NOTSET)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def exposed_by(records, name):
    return [r for r in records if "exposed memory" in r.getMessage() and name in r.getMessage()]


def expose_once(name):
    async def main():
        connector = nc.Connector(name, backend="loopback")
        readable = await connector.create_readable(nc.Descriptor(bytes(64)))
        readable.cancel()

    run(main())


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_records_reach_the_logger_only_at_levels_it_is_enabled_for():
    handler = Collect()
    LOGGER.addHandler(handler)
    old = LOGGER.level
    try:
        quiet, loud = f"quiet-{uuid.uuid4().hex[:8]}", f"loud-{uuid.uuid4().hex[:8]}"
        LOGGER.setLevel(logging.WARNING)
        expose_once(quiet)  # a DEBUG record: not built at WARNING
        LOGGER.setLevel(logging.DEBUG)
        expose_once(loud)  # a new connector reads the level again
        assert wait_for(lambda: exposed_by(handler.records, loud))
        # Records are delivered in order: the quiet one would have come first.
        assert exposed_by(handler.records, quiet) == []
        record = exposed_by(handler.records, loud)[0]
        assert (record.name, record.levelno) == ("nixl_connect", logging.DEBUG)
        assert "bytes=64" in record.getMessage()
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(old)


def test_nothing_is_printed_where_logging_is_not_configured():
    # The package's logger has a handler (a NullHandler), so a record goes
    # nowhere unless the application configures logging: without one, logging's
    # last-resort handler would print WARNING records on stderr.
    code = (
        "import logging, nixl_connect as nc\n"
        "log = logging.getLogger('nixl_connect')\n"
        "assert any(isinstance(h, logging.NullHandler) for h in log.handlers)\n"
        "log.warning('library record')\n"
        "print('done')\n"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "done"
    assert "library record" not in child.stderr


def test_nixl_log_level_is_settable_and_checked():
    import pytest

    with pytest.raises(ValueError, match="unknown NIXL log level"):
        nc.set_nixl_log_level("chatty")
    require_backend("nixl")
    for level in ("off", "error", "info"):
        nc.set_nixl_log_level(level)
