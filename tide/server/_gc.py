"""Garbage collector settings for a long-running service.

A produce or pull allocates many short-lived objects (protobuf wrappers, tuples, futures)
that reference counting frees at once; with CPython's default young-generation
threshold (700 allocations) the cyclic collector still runs hundreds of times a second
under load, and every older-generation pass walks the whole heap of long-lived objects
(routes, caches, mapped files). Once a service is up, its objects are frozen (moved out
of the collector's sight: they live as long as the process) and the young generation
is collected every :data:`YOUNG_THRESHOLD_OBJECTS` allocations instead. Cycles are still
collected, only less often.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD_OBJECTS = 50_000
# Young collections before a middle one, middle collections before a full one.
MIDDLE_EVERY = 20
FULL_EVERY = 20


def tune_gc_for_serving() -> None:
    """Freeze what startup allocated and collect less often (call once, when serving)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD_OBJECTS, MIDDLE_EVERY, FULL_EVERY)
