"""The server bootstrap every Tide service uses: configuration, logging, telemetry and the
asyncio gRPC runner (health, reflection, graceful shutdown, error mapping), metrics
(``--metrics-listen``, :func:`service_meter`) and traces carried between the services
(:func:`traced_channel`).

A service's ``__main__``::

    config = load_config("storage", STORAGE_OPTIONS, sys.argv[1:])
    run_service(StorageService(config), config)
"""

from tide.server._bootstrap import (
    ANSWER_FRAMING_BYTES,
    HEALTH_SERVICE_NAME,
    MAX_MESSAGE_BYTES,
    REFLECTION_SERVICE_NAME,
    ListenError,
    Service,
    parse_listen,
    run_service,
    serve,
    write_ready_file,
)
from tide.server._byte_budget import ByteBudget
from tide.server._cluster_secret import cluster_channel
from tide.server._cold_reads import COLD_READ_THREADS, COLD_READS_IN_FLIGHT, ColdReads
from tide.server._config import COMMON_OPTIONS, Config, ConfigError, Option, load_config
from tide.server._event_loop import EVENT_LOOPS, run_on
from tide.server._interceptor import ServiceError
from tide.server._logging import configure_logging
from tide.server._metrics import SampledGauges, service_meter
from tide.server._peer import peer_address
from tide.server._stream_slots import StreamSlots
from tide.server._telemetry import Telemetry, TelemetryError, configure_telemetry, tracing_enabled
from tide.server._tracing import traced_channel
from tide.spawn import READY_FILE_ENV

__all__ = [
    "ANSWER_FRAMING_BYTES",
    "COLD_READS_IN_FLIGHT",
    "COLD_READ_THREADS",
    "COMMON_OPTIONS",
    "EVENT_LOOPS",
    "HEALTH_SERVICE_NAME",
    "MAX_MESSAGE_BYTES",
    "READY_FILE_ENV",
    "REFLECTION_SERVICE_NAME",
    "ByteBudget",
    "ColdReads",
    "Config",
    "ConfigError",
    "ListenError",
    "Option",
    "SampledGauges",
    "Service",
    "ServiceError",
    "StreamSlots",
    "Telemetry",
    "TelemetryError",
    "cluster_channel",
    "configure_logging",
    "configure_telemetry",
    "load_config",
    "parse_listen",
    "peer_address",
    "run_on",
    "run_service",
    "serve",
    "service_meter",
    "traced_channel",
    "tracing_enabled",
    "write_ready_file",
]
