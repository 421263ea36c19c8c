"""Authentication and authorization shared by the gateway and tide.client (issue 22):
request signatures (signature.py) and ACL 2.0 users and policies (model.py, decide.py)."""
