"""Transactional messages beside the half and op queues (issue 19): docs/client.md,
"Transactions"; docs/formats.md, "Transactional messages"."""
