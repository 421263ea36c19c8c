"""The RocketMQ 5 gRPC protocol (``apache.rocketmq.v2``), generated from
protos/apache/rocketmq/v2 by ``make protos``: the gateway serves its MessagingService
(services/gateway/v2) beside ``tide.v1.Gateway``. Kept under ``tide`` so no top-level
``apache`` package ships (the official RocketMQ clients bring their own, which registers
the same protobuf names: the two cannot share one process)."""
