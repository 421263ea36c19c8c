"""The console pages' data: plain typed functions and dataclasses over ``tide.client``'s
sync API (no web code, no protobuf). Every read is bounded by a limit of ``limits``."""
