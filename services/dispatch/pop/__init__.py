"""POP consumption beside the consume queues (issue 20, docs/pop.md)."""
