"""Topics: the list with message types; a topic's queues and offsets; create, update and
delete (the delete asks for the topic's name typed again, as a confirmation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from services.console.gateway import GatewayError
from services.console.pages._util import gateway_of, page_rows, quoted
from services.console.render import NavEntry, render
from services.console.session import checked_form, flash
from tide.client import Admin, MessageQueue
from tide.limits import QUEUE_NUMS_MAX
from tide.naming import topic_error

NAV = NavEntry("Topics", "/topics")
MESSAGE_TYPES = ("", "FIFO", "DELAY", "TRANSACTION", "MIXED")  # "": NORMAL
PERMS = {"6": "read and write", "4": "read only", "2": "write only"}
DEFAULT_QUEUES = 4
# The session's name of the changes (create, update, delete) when the gateway denies one.
TOPIC_CHANGE = "topic-change"


@dataclass(frozen=True)
class QueueRow:
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int

    @property
    def messages(self) -> int:
        return self.max_offset - self.min_offset


def _topic_path(topic: str) -> str:
    return "/topics/" + quote(topic, safe="")


async def topics_page(request: Request) -> Response:
    page, rows = page_rows(request)
    types = await gateway_of(request).call(request, lambda admin: admin.topic_types())
    listed = sorted(types.items())
    shown = listed[(page - 1) * rows : page * rows]
    return render(
        request,
        "topics.html",
        {
            "title": "Topics",
            "topics": shown,
            "total": len(listed),
            "page": page,
            "more": page * rows < len(listed),
            "rows": rows,
        },
    )


def _new_form(values: dict[str, str] | None = None) -> dict[str, str]:
    defaults = {"topic": "", "queues": str(DEFAULT_QUEUES), "perm": "6", "message_type": ""}
    return {**defaults, **(values or {})}


async def new_topic_form(request: Request) -> Response:
    return render(
        request,
        "topic_new.html",
        {
            "title": "Create a topic",
            "form": _new_form(),
            "errors": {},
            "message_types": MESSAGE_TYPES,
            "perms": PERMS,
            "queue_max": QUEUE_NUMS_MAX,
        },
    )


def _validated(form: FormData, *, with_name: bool) -> tuple[dict[str, str], dict[str, str]]:
    """The form's values (as typed, bounded) and an error per bad field."""
    values = {
        key: str(form.get(key, ""))[:200] for key in ("topic", "queues", "perm", "message_type")
    }
    errors: dict[str, str] = {}
    if with_name:
        problem = topic_error(values["topic"])
        if problem is not None:
            errors["topic"] = problem
    try:
        queues = int(values["queues"])
    except ValueError:
        queues = 0
    if not 1 <= queues <= QUEUE_NUMS_MAX:
        errors["queues"] = f"Give a whole number of queues, 1..{QUEUE_NUMS_MAX}."
    if values["perm"] not in PERMS:
        errors["perm"] = "Choose read and write, read only or write only."
    if values["message_type"] not in MESSAGE_TYPES:
        errors["message_type"] = "Choose NORMAL, FIFO, DELAY, TRANSACTION or MIXED."
    return values, errors


def _create(values: dict[str, str]) -> Any:
    def work(admin: Admin) -> list[str]:
        return admin.create_topic(
            values["topic"],
            read_queue_nums=int(values["queues"]),
            perm=int(values["perm"]),
            message_type=values["message_type"],
        )

    return work


async def create_topic(request: Request) -> Response:
    form = await checked_form(request)
    values, errors = _validated(form, with_name=True)
    if not errors:
        try:
            brokers = await gateway_of(request).change(request, TOPIC_CHANGE, _create(values))
        except GatewayError as exc:
            if exc.status >= 500 or exc.status in (401, 403):
                raise
            errors["topic"] = exc.message
        else:
            flash(request, f"Created topic {values['topic']} on {', '.join(brokers)}.")
            return RedirectResponse(_topic_path(values["topic"]), status_code=303)
    return render(
        request,
        "topic_new.html",
        {
            "title": "Create a topic",
            "form": _new_form(values),
            "errors": errors,
            "message_types": MESSAGE_TYPES,
            "perms": PERMS,
            "queue_max": QUEUE_NUMS_MAX,
        },
        400,
    )


def _topic_name(request: Request) -> str:
    topic = str(request.path_params["topic"])
    problem = topic_error(topic)
    if problem is not None:
        raise HTTPException(400, problem)
    return topic


def _detail(topic: str) -> Any:
    def work(admin: Admin) -> tuple[Any, list[QueueRow]]:
        route = admin.route(topic)
        queues: list[MessageQueue] = admin.queues(topic)
        rows = []
        for queue in queues:
            offsets = admin.offsets(queue)
            rows.append(
                QueueRow(queue.broker_name, queue.queue_id, offsets.min_offset, offsets.max_offset)
            )
        return route, rows

    return work


async def topic_page(
    request: Request, errors: dict[str, str] | None = None, status: int = 200
) -> Response:
    topic = _topic_name(request)
    route, rows = await gateway_of(request).call(request, _detail(topic))
    datas = sorted(route.queue_datas, key=lambda d: d.broker_name)
    first = datas[0] if datas else None
    form = {
        "queues": str(first.read_queue_nums if first else DEFAULT_QUEUES),
        "perm": str(first.perm & 6 if first else 6),
        "message_type": "" if route.message_type in ("", "NORMAL") else route.message_type,
    }
    return render(
        request,
        "topic.html",
        {
            "title": f"Topic {topic}",
            "topic": topic,
            "datas": datas,
            "rows": rows,
            "message_type": route.message_type or "NORMAL",
            "form": form,
            "errors": errors or {},
            "message_types": MESSAGE_TYPES,
            "perms": PERMS,
            "queue_max": QUEUE_NUMS_MAX,
            "total": sum(row.messages for row in rows),
        },
        status,
    )


async def update_topic(request: Request) -> Response:
    topic = _topic_name(request)
    form = await checked_form(request)
    values, errors = _validated(form, with_name=False)
    values["topic"] = topic
    if errors:
        return await topic_page(request, errors, 400)
    brokers = await gateway_of(request).change(request, TOPIC_CHANGE, _create(values))
    flash(request, f"Updated topic {topic} on {', '.join(brokers)}.")
    return RedirectResponse(_topic_path(topic), status_code=303)


async def delete_form(request: Request) -> Response:
    topic = _topic_name(request)
    return render(
        request,
        "topic_delete.html",
        {
            "title": f"Delete topic {topic}",
            "topic": topic,
            "errors": {},
            "confirm": "",
        },
    )


async def delete_topic(request: Request) -> Response:
    topic = _topic_name(request)
    form = await checked_form(request)
    confirm = str(form.get("confirm", ""))[:200]
    if confirm != topic:
        errors = {
            "confirm": f"Type the topic's name, {topic}, exactly to delete it "
            f"(you typed {quoted(confirm)})."
        }
        return render(
            request,
            "topic_delete.html",
            {
                "title": f"Delete topic {topic}",
                "topic": topic,
                "errors": errors,
                "confirm": confirm,
            },
            400,
        )
    existed = await gateway_of(request).change(
        request, TOPIC_CHANGE, lambda admin: admin.delete_topic(topic)
    )
    flash(request, f"Deleted topic {topic}." if existed else f"No broker had topic {topic}.")
    return RedirectResponse("/topics", status_code=303)


ROUTES = (
    Route("/topics", topics_page, methods=["GET"]),
    Route("/topics/new", new_topic_form, methods=["GET"]),
    Route("/topics/new", create_topic, methods=["POST"]),
    Route("/topics/{topic}", topic_page, methods=["GET"]),
    Route("/topics/{topic}", update_topic, methods=["POST"]),
    Route("/topics/{topic}/delete", delete_form, methods=["GET"]),
    Route("/topics/{topic}/delete", delete_topic, methods=["POST"]),
)
