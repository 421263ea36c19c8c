"""Dead letters: a group's ``%DLQ%<group>`` paged; resend selected ones or all to their
original topics as a background job whose progress the page polls."""

from __future__ import annotations

from urllib.parse import quote

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from services.console.data.dead_letters import list_page
from services.console.data.limits import DLQ_PAGE_MAX, RESEND_MAX_MESSAGES
from services.console.data.resend import Progress, ResendJobs
from services.console.pages._times import utc_text
from services.console.pages._util import gateway_of
from services.console.render import NavEntry, render
from services.console.session import checked_form, flash, session_of
from tide.client import TideError

NAV = NavEntry("Dead letters", "/dead-letters")


def _jobs(request: Request) -> ResendJobs:
    jobs: ResendJobs = request.app.state.resend_jobs
    return jobs


async def dead_letters_page(request: Request) -> Response:
    group = request.query_params.get("group", "").strip()
    cursor = request.query_params.get("cursor", "")
    page = None
    if group:
        page = await gateway_of(request).call(
            request, lambda admin: list_page(admin, group, cursor)
        )
    return render(
        request,
        "dead_letters.html",
        {
            "title": "Dead letters",
            "group": group,
            "page": page,
            "utc": utc_text,
            "page_max": DLQ_PAGE_MAX,
            "resend_max": RESEND_MAX_MESSAGES,
        },
    )


async def resend(request: Request) -> Response:
    form = await checked_form(request)
    group = str(form.get("group", "")).strip()
    if not group:
        raise HTTPException(400, "give the consumer group whose dead letters to resend")
    everything = form.get("all") == "1"
    msg_ids = [] if everything else [str(v) for v in form.getlist("msg_id")]
    if not everything and not msg_ids:
        flash(request, "Select dead letters to resend, or resend all.", "error")
        return RedirectResponse(f"/dead-letters?group={quote(group)}", status_code=303)
    credentials = session_of(request).credentials
    gateway = gateway_of(request)
    try:
        job_id = _jobs(request).start(
            session_of(request).access_key,
            group,
            msg_ids,
            lambda: gateway.open_admin(credentials),
            lambda: gateway.open_producer(credentials),
        )
    except TideError as exc:
        flash(request, str(exc), "error")
        return RedirectResponse(f"/dead-letters?group={quote(group)}", status_code=303)
    return RedirectResponse(f"/dead-letters/jobs/{job_id}", status_code=303)


def _progress(request: Request) -> Progress:
    try:
        return _jobs(request).progress(session_of(request).access_key, request.path_params["job"])
    except TideError as exc:
        raise HTTPException(404, str(exc)) from None


async def job_page(request: Request) -> Response:
    progress = _progress(request)
    return render(
        request,
        "resend_job.html",
        {"title": f"Resending dead letters of {progress.group}", "job": progress},
    )


async def job_json(request: Request) -> Response:
    progress = _progress(request)
    return JSONResponse(
        {
            "total": progress.total,
            "done": progress.done,
            "failed": progress.failed,
            "skipped": progress.skipped,
            "handled": progress.handled,
            "finished": progress.finished,
            "errors": list(progress.errors),
        }
    )


ROUTES = (
    Route("/dead-letters", dead_letters_page),
    Route("/dead-letters/resend", resend, methods=["POST"]),
    Route("/dead-letters/jobs/{job}.json", job_json),
    Route("/dead-letters/jobs/{job}", job_page),
)
