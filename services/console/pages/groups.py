"""Consumer groups: the groups with a config; a group's members, its lag per queue on each
topic it consumes (pull and POP groups: ready, in flight, delayed), its retry and dead-letter
counts, and a reset of its offsets to a time (confirmed, refused while members are online
unless forced, as RocketMQ's dashboard does)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from services.console.gateway import GatewayError
from services.console.pages._reset import ResetPlan, apply_reset, parse_time_ms, plan_reset
from services.console.pages._util import gateway_of, page_rows
from services.console.render import NavEntry, render
from services.console.session import checked_form, flash
from tide.client import Admin, GroupLag, MessageQueue, NotFound
from tide.naming import consumer_group_error, topic_error

NAV = NavEntry("Consumer groups", "/groups")
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
# Auto refresh periods a page may ask (?refresh=S); anything else is refused.
REFRESH_CHOICES_S = (2, 5, 10, 30, 60)
MAX_TOPICS_SHOWN = 20  # topics a group's page shows the lag of
OFFSET_RESET = "offset-reset"  # the session's name of a reset the gateway denied


@dataclass(frozen=True)
class MemberRow:
    client_id: str
    subscriptions: str
    last_heartbeat_ms: int


@dataclass(frozen=True)
class GroupView:
    found: bool
    config: Any
    members: list[MemberRow]
    topics: list[str]
    lags: list[tuple[str, GroupLag | str]]
    retry_count: int | None
    dlq_count: int | None


def group_path(group: str) -> str:
    return "/groups/" + quote(group, safe="")


def _group_name(request: Request) -> str:
    group = str(request.path_params["group"])
    problem = consumer_group_error(group)
    if problem is not None:
        raise HTTPException(400, problem)
    return group


async def groups_page(request: Request) -> Response:
    page, rows = page_rows(request)
    wanted = request.query_params.get("group", "")
    if wanted:
        problem = consumer_group_error(wanted)
        if problem is None:
            return RedirectResponse(group_path(wanted), status_code=303)
        groups = await gateway_of(request).call(request, lambda admin: admin.list_groups())
        return _groups(request, groups, page, rows, {"group": problem}, wanted, 400)
    groups = await gateway_of(request).call(request, lambda admin: admin.list_groups())
    return _groups(request, groups, page, rows, {}, "", 200)


def _groups(
    request: Request,
    groups: list[Any],
    page: int,
    rows: int,
    errors: dict[str, str],
    wanted: str,
    status: int,
) -> Response:
    shown = groups[(page - 1) * rows : page * rows]
    return render(
        request,
        "groups.html",
        {
            "title": "Consumer groups",
            "groups": shown,
            "total": len(groups),
            "page": page,
            "rows": rows,
            "more": page * rows < len(groups),
            "errors": errors,
            "wanted": wanted[:200],
        },
        status,
    )


def _stored(admin: Admin, topic: str) -> int | None:
    """Messages kept in ``topic`` (max - min over its queues); None: no such topic. The
    route's queues, not only the readable ones, through BrowseQueue (the operator's read,
    one message): a dead-letter topic is write-only, and GetQueueOffsets refuses it."""
    try:
        route = admin.route(topic)
    except NotFound:
        return None
    total = 0
    for data in route.queue_datas:
        for queue_id in range(max(data.read_queue_nums, data.write_queue_nums)):
            browsed = admin.browse_queue(MessageQueue(topic, data.broker_name, queue_id), 0, 1)
            total += browsed.max_offset - browsed.min_offset
    return total


def _view(group: str, extra_topic: str) -> Any:
    def work(admin: Admin) -> GroupView:
        answer = admin.get_group(group)
        members = admin.members(group)
        topics: list[str] = []
        rows = []
        for member in members:
            subs = [s for s in member.subscriptions if not s.topic.startswith(RETRY_PREFIX)]
            topics += [s.topic for s in subs]
            text = ", ".join(f"{s.topic} ({s.expression or '*'})" for s in subs)
            rows.append(MemberRow(member.client_id, text, member.last_heartbeat_ms))
        if extra_topic:
            topics.append(extra_topic)
        topics = sorted(set(topics))[:MAX_TOPICS_SHOWN]
        lags: list[tuple[str, GroupLag | str]] = []
        for topic in topics:
            try:
                lags.append((topic, admin.group_lag(group, topic)))
            except NotFound as exc:
                lags.append((topic, str(exc)[:300]))
        return GroupView(
            answer.found,
            answer.group,
            rows,
            topics,
            lags,
            _stored(admin, RETRY_PREFIX + group),
            _stored(admin, DLQ_PREFIX + group),
        )

    return work


def _refresh_s(request: Request) -> int:
    text = request.query_params.get("refresh", "")
    if not text:
        return 0
    if not text.isdigit() or int(text) not in REFRESH_CHOICES_S:
        raise HTTPException(400, f"refresh must be one of {REFRESH_CHOICES_S} seconds")
    return int(text)


async def group_page(request: Request) -> Response:
    group = _group_name(request)
    topic = request.query_params.get("topic", "")[:200]
    errors: dict[str, str] = {}
    if topic and (problem := topic_error(topic)) is not None:
        errors["topic"] = problem
        topic = ""
    view = await gateway_of(request).call(request, _view(group, topic))
    refresh_s = _refresh_s(request)
    here = {"topic": topic} if topic else {}
    return render(
        request,
        "group.html",
        {
            "title": f"Consumer group {group}",
            "group": group,
            "view": view,
            "errors": errors,
            "topic": topic,
            "refresh_s": refresh_s,
            "refresh_choices": REFRESH_CHOICES_S,
            "refresh_query": urlencode({**here, "refresh": REFRESH_CHOICES_S[1]}),
            "plain_query": urlencode(here),
            "reset": {"topic": topic or (view.topics[0] if view.topics else ""), "time": ""},
            "reset_errors": {},
        },
        400 if errors else 200,
    )


def _reset_fields(form: Any) -> tuple[dict[str, str], dict[str, str], int]:
    values = {key: str(form.get(key, ""))[:200] for key in ("topic", "time")}
    errors: dict[str, str] = {}
    problem = topic_error(values["topic"])
    if problem is not None:
        errors["topic"] = problem
    timestamp_ms = -1
    try:
        timestamp_ms = parse_time_ms(values["time"])
    except ValueError as exc:
        errors["time"] = str(exc)
    return values, errors, timestamp_ms


async def reset_offsets(request: Request) -> Response:
    """Step 1 (no ``confirmed``): show the plan, the offset each queue would get. Step 2
    (``confirmed``): commit them."""
    group = _group_name(request)
    form = await checked_form(request)
    values, errors, timestamp_ms = _reset_fields(form)
    force = form.get("force") == "1"
    gateway = gateway_of(request)
    if errors:
        view = await gateway.call(
            request, _view(group, values["topic"] if "topic" not in errors else "")
        )
        return _reset_refused(request, group, view, values, errors)
    try:
        plan: ResetPlan = await gateway.call(
            request, lambda admin: plan_reset(admin, group, values["topic"], timestamp_ms)
        )
    except GatewayError as exc:
        if exc.status != 404:
            raise
        view = await gateway.call(request, _view(group, ""))
        return _reset_refused(request, group, view, values, {"topic": exc.message})
    if plan.members and not force:
        view = await gateway.call(request, _view(group, values["topic"]))
        message = (
            f"{len(plan.members)} member(s) of {group} are online: they keep their own "
            "offsets and would overwrite the reset. Stop them first, or tick "
            "'Reset while members are online'."
        )
        return _reset_refused(request, group, view, values, {"force": message})
    if form.get("confirmed") != "1":
        return render(
            request,
            "group_reset.html",
            {
                "title": f"Reset offsets of {group}",
                "group": group,
                "plan": plan,
                "values": values,
                "force": force,
            },
        )
    changed = await gateway.change(
        request, OFFSET_RESET, lambda admin: apply_reset(admin, group, plan)
    )
    flash(request, f"Reset {changed} queue(s) of {values['topic']} for group {group}.")
    return RedirectResponse(
        group_path(group) + "?" + urlencode({"topic": values["topic"]}), status_code=303
    )


def _reset_refused(
    request: Request,
    group: str,
    view: GroupView,
    values: dict[str, str],
    errors: dict[str, str],
) -> Response:
    return render(
        request,
        "group.html",
        {
            "title": f"Consumer group {group}",
            "group": group,
            "view": view,
            "errors": {},
            "topic": "",
            "refresh_s": 0,
            "refresh_choices": REFRESH_CHOICES_S,
            "refresh_query": urlencode({"refresh": REFRESH_CHOICES_S[1]}),
            "plain_query": "",
            "reset": values,
            "reset_errors": errors,
        },
        400,
    )


ROUTES = (
    Route("/groups", groups_page, methods=["GET"]),
    Route("/groups/{group}", group_page, methods=["GET"]),
    Route("/groups/{group}/reset", reset_offsets, methods=["POST"]),
)
