"""Messages: search by msg id, key, unique key or store time range; one message's body
(text, JSON, hex), properties, place in the commitlog and trace."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.console.data import messages as search
from services.console.data.limits import SEARCH_MAX_RESULTS
from services.console.data.trace import trace
from services.console.gateway import GatewayError
from services.console.pages._times import form_ms, utc_text
from services.console.pages._util import gateway_of
from services.console.render import NavEntry, render
from tide.client import Admin

NAV = NavEntry("Messages", "/messages")
KINDS = {
    "key": "Key",
    "unique_key": "Unique key (client message id)",
    "msg_id": "Message id",
    "time": "Store time range",
}
# Groups named in the trace form ("also look at"), comma separated; at most this many.
MAX_NAMED_GROUPS = 16


async def messages_page(request: Request) -> Response:
    params = request.query_params
    form = {name: params.get(name, "") for name in ("kind", "topic", "value", "begin", "end")}
    form["kind"] = form["kind"] if form["kind"] in KINDS else "key"
    context: dict[str, object] = {
        "title": "Messages",
        "form": form,
        "kinds": KINDS,
        "result": None,
        "error": "",
        "utc": utc_text,
        "max_results": SEARCH_MAX_RESULTS,
    }
    if "kind" not in params:
        return render(request, "messages.html", context)
    begin, end = form_ms(form["begin"], "from"), form_ms(form["end"], "to")
    kind, topic, value = form["kind"], form["topic"], form["value"]

    def find(admin: Admin) -> search.SearchResult:
        if kind == "msg_id":
            return search.by_id(admin, value)
        if kind == "unique_key":
            return search.by_unique_key(admin, topic, value)
        if kind == "time":
            return search.by_time(admin, topic, begin, end)
        return search.by_key(admin, topic, value, begin, end)

    try:
        context["result"] = await gateway_of(request).call(request, find)
    except GatewayError as exc:
        context["error"] = exc.message
        return render(request, "messages.html", context, status=exc.status)
    return render(request, "messages.html", context)


async def message_page(request: Request) -> Response:
    msg_id = request.path_params["msg_id"]
    named = [g.strip() for g in request.query_params.get("groups", "").split(",") if g.strip()]
    template = request.app.state.config.trace_url_template
    found = await gateway_of(request).call(
        request, lambda admin: trace(admin, msg_id, template, named[:MAX_NAMED_GROUPS])
    )
    message = found.message
    return render(
        request,
        "message.html",
        {
            "title": f"Message {message.msg_id}",
            "message": message,
            "body": message.preview(),
            "trace": found,
            "groups": ", ".join(named[:MAX_NAMED_GROUPS]),
            "utc": utc_text,
        },
    )


ROUTES = (
    Route("/messages", messages_page),
    Route("/messages/{msg_id}", message_page),
)
