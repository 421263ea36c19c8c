"""The Tide web console (issue 23; docs/console.md): a stateless Starlette app that talks to
the gateway's tide.v1 API through tide.client only. ``python -m services.console``."""
