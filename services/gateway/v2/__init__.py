"""``apache.rocketmq.v2.MessagingService`` on the gateway: RocketMQ 5's gRPC protocol,
translated onto the same operations as ``tide.v1.Gateway`` (one message model, two wire
APIs; protobuf of either kind only at the edge). One small module per area: routes,
send, transactions, consume (POP), offsets (pull), telemetry, messages (the message
conversions) and status (RocketMQ's answer codes). docs/rocketmq5.md tells users what
is supported and what differs."""
