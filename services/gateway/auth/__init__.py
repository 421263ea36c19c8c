"""The gateway's authentication and authorization (issue 22; docs/security.md)."""
