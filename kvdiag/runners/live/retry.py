"""When and how long to retry a request to a live endpoint (tenacity), honouring Retry-After.

A transport error or a status in RETRY_STATUS is retried, up to `retries` more attempts.
The wait before the next attempt is the server's `Retry-After` (delta-seconds or an
HTTP-date, RFC 9110 §10.2.3) when it sent one, capped at `max_wait` so a server cannot park
a run for hours; otherwise exponential backoff 0.5 s, 1 s, 2 s ... (also capped).
When attempts run out, the last response is returned (the caller judges its status) and a
transport error becomes EndpointError (exit 2).
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

import httpx
import tenacity

from kvdiag.errors import EndpointError

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
BACKOFF_FIRST = 0.5  # seconds before the second attempt; doubles after each
MAX_WAIT = 30.0  # seconds: the cap on any single wait, Retry-After included


def retry_after_seconds(response: httpx.Response, now: datetime | None = None) -> float | None:
    """Seconds the server asked to wait (Retry-After), or None when absent or unreadable."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # an HTTP-date is GMT by definition
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when - (now or datetime.now(timezone.utc))).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def policy(retries: int, base_url: str, max_wait: float = MAX_WAIT) -> dict:
    """Keyword arguments for tenacity.Retrying / AsyncRetrying (see the module docstring)."""

    def wait(state: tenacity.RetryCallState) -> float:
        backoff = BACKOFF_FIRST * 2 ** (state.attempt_number - 1)
        outcome = state.outcome
        if outcome is not None and not outcome.failed:
            asked = retry_after_seconds(outcome.result())
            if asked is not None:
                return min(asked, max_wait)
        return min(backoff, max_wait)

    def give_up(state: tenacity.RetryCallState) -> httpx.Response:
        outcome = state.outcome
        if outcome.failed:
            error = outcome.exception()
            raise EndpointError(f"cannot reach {base_url}: {type(error).__name__}") from None
        return outcome.result()

    return {
        "stop": tenacity.stop_after_attempt(retries + 1),
        "wait": wait,
        "retry": (tenacity.retry_if_exception_type(httpx.TransportError)
                  | tenacity.retry_if_result(lambda r: r.status_code in RETRY_STATUS)),
        "retry_error_callback": give_up,
    }


def request(client: httpx.Client, retries: int, base_url: str, method: str, path: str,
            max_wait: float = MAX_WAIT, **kw) -> httpx.Response:
    """client.request(method, path, **kw) under the policy above."""
    return tenacity.Retrying(**policy(retries, base_url, max_wait))(
        client.request, method, path, **kw)


async def arequest(client: httpx.AsyncClient, retries: int, base_url: str, method: str,
                   path: str, max_wait: float = MAX_WAIT, **kw) -> httpx.Response:
    """The same for an AsyncClient (waits with asyncio.sleep, so other requests go on)."""
    return await tenacity.AsyncRetrying(**policy(retries, base_url, max_wait))(
        client.request, method, path, **kw)
