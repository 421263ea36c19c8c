"""Tide's web console (issue 23): a stateless process talking to the gateway's API."""
