"""Run the real collector (create_app + ingest router + embedded store) as a process: argv = data keys port."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import uvicorn

from kernel_insight.collector.app import create_app
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.ingest import ingest_router
from kernel_insight.collector.keys import KeyStore
from kernel_insight.collector.sink import StoreSink


def main() -> None:
    data, keys, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    logging.basicConfig(level=logging.WARNING)
    store = EmbeddedStore(data)
    app = create_app(store, routers=[ingest_router(KeyStore(keys), StoreSink(store))])
    try:
        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    finally:
        store.close()


if __name__ == "__main__":
    main()
