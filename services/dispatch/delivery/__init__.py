"""Delivery services beside the consume queues: delay levels and the timer (docs/delivery.md)."""
