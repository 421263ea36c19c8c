"""``Admin``'s group configs and topic message types against a real cluster."""

from __future__ import annotations

import pytest

from tests._cluster import Cluster
from tide.client import Admin, InvalidArgument
from tide.v1 import storage_pb2

CUSTOMIZED = storage_pb2.RetryPolicy.CUSTOMIZED
EXPONENTIAL = storage_pb2.RetryPolicy.EXPONENTIAL


def test_create_update_show_list_delete_group(cluster: Cluster) -> None:
    with Admin(cluster.gateway.listen) as admin:
        assert admin.create_group("g_client_cfg", retry_max_times=4, retry_delays_ms=[1000, 2000])
        config = admin.get_group("g_client_cfg")
        assert config.found
        group = config.group
        assert (group.retry_max_times, group.retry_queue_nums, group.consume_enable) == (4, 1, True)
        assert group.retry_policy.type == CUSTOMIZED
        assert list(group.retry_policy.delays_ms) == [1000, 2000]

        # An update changes what it names; a policy type switch drops the other's list.
        admin.update_group("g_client_cfg", retry_policy="exponential", retry_initial_ms=2000)
        group = admin.get_group("g_client_cfg").group
        assert group.retry_max_times == 4
        assert group.retry_policy == storage_pb2.RetryPolicy(
            type=EXPONENTIAL, initial_ms=2000, max_ms=7_200_000, multiplier=2
        )
        admin.update_group("g_client_cfg", consume_enable=False)
        assert not admin.get_group("g_client_cfg").group.consume_enable

        assert "g_client_cfg" in [g.group_name for g in admin.list_groups()]
        assert admin.delete_group("g_client_cfg")
        assert not admin.get_group("g_client_cfg").found
        assert not admin.delete_group("g_client_cfg")


def test_group_input_is_checked(cluster: Cluster) -> None:
    with Admin(cluster.gateway.listen) as admin:
        with pytest.raises(InvalidArgument, match="retry_policy is 'linear'"):
            admin.create_group("g_client_bad", retry_policy="linear")
        with pytest.raises(InvalidArgument, match="for an exponential policy"):
            admin.create_group("g_client_bad", retry_multiplier=3, retry_policy="customized")
        with pytest.raises(InvalidArgument, match="retry_queue_nums is 2000"):
            admin.create_group("g_client_bad", retry_queue_nums=2000)
        with pytest.raises(InvalidArgument):
            admin.get_group("bad name")


def test_topic_message_types(cluster: Cluster) -> None:
    with Admin(cluster.gateway.listen) as admin:
        admin.create_topic("T_client_delay", message_type="delay")
        assert admin.route("T_client_delay").message_type == "DELAY"
        assert admin.topic_types()["T_client_delay"] == "DELAY"
        assert "SCHEDULE_TOPIC_XXXX" not in admin.list_topics()
        assert "SCHEDULE_TOPIC_XXXX" in admin.list_topics(include_hidden=True)
        with pytest.raises(InvalidArgument, match="message_type is 'LIFO'"):
            admin.create_topic("T_client_bad", message_type="LIFO")
