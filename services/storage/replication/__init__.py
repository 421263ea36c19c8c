"""Master/slave replication of the commitlog (RocketMQ's HAService) over ``Replicate``.

``settings`` (roles, options), ``master`` (the master's side of a stream), ``slave`` (the
slave's reconnecting client), ``fresh_slave`` (an empty slave starts at the master's min
offset), ``metadata_sync`` (a slave copies its master's config files: RocketMQ's
SlaveSynchronize), ``node`` (the role as the servicer sees it). The engine parts are
``engine/ha_ack_waiter.py`` (SYNC_MASTER waits) and ``engine/ha_replica_writer.py``.

Metrics: not yet. The observability issue should export, from ``GetStatus``'s
``replication`` values: per slave the ack offset, lag bytes and lag seconds, and on a
slave its lag and connection state (plus counters of chunks and bytes sent/written).
"""
