"""The delivery services of the dispatch process (docs/delivery.md).

They read system topics' consume queues beside the dispatch (``SCHEDULE_TOPIC_XXXX``'s
levels, the timer topic), and when a message is due append its real copy through the
followed storage's Append API (:mod:`services.dispatch.delivery.reput`). They deliver
only while that storage is a master, and keep their progress in the dispatch's store
directory, copied to the storage so slaves have it.

One small module per service: ``schedule`` (delay levels), the timer's modules; and
what they share: ``reput`` (due records to Append), ``role`` (whether the storage is a
master), ``progress`` (the copy of their progress to the storage), ``metrics``, and one
``services.dispatch.storage_client.StorageClient`` (a channel of their own).
"""
