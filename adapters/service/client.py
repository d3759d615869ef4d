"""A gateway's client of `POST /v1/events` (what `ens post` uses): batches of JSON lines, retried
only when the service surely accepted none of a request (the connection was refused, or it
answered 503/429), with `notifiers.backoff`'s waits, for up to a patience; a request too large
(413) is split until it fits. A retry never posts an event twice."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from adapters.errors import PostFailed
from notifiers.backoff import retry_delay as _delay
from notifiers.webhook import parse_retry_after


def batches(lines: Iterator[str], size: int) -> Iterator[list[tuple[int, str]]]:
    """(file line number, line) batches of non-blank lines."""
    batch: list[tuple[int, str]] = []
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            batch.append((lineno, line.rstrip("\r\n")))
            if len(batch) >= size:
                yield batch
                batch = []
    if batch:
        yield batch


def retry_delay(attempt: int, retry_after: float | None, rng: Any = None) -> float:
    """The wait before retry ``attempt`` (1, 2, ...): `notifiers.backoff`'s rule, 0.5 s
    doubling, at most 30 s, never less than the service's Retry-After."""
    return _delay(attempt, retry_after, 0.5, 30.0, rng=rng)


def answer(resp: httpx.Response) -> str:
    """``HTTP 503: <the service's reason>``: what an error answer said, not only its code."""
    reason = ""
    try:
        data = resp.json()
        if isinstance(data, dict):
            reason = str(data.get("error") or data.get("detail") or "")
    except ValueError:
        reason = resp.text.strip()[:200]
    return f"HTTP {resp.status_code}: {reason}" if reason else f"HTTP {resp.status_code}"


def service_url(url: str) -> str:
    """The service's base URL; ``127.0.0.1:8080`` (no scheme) means ``http://127.0.0.1:8080``.
    `ValueError` saying what is wrong."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parsed = httpx.URL(text)
    except httpx.InvalidURL as exc:
        raise ValueError(f"{exc} (expected e.g. http://127.0.0.1:8080)") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(
            "expected an http:// or https:// URL with a host (e.g. http://127.0.0.1:8080)"
        )
    return text


def restamp(lines: list[str], now: float) -> list[str]:
    """The events of JSON lines shifted in time so that the latest is stamped ``now`` (epoch
    seconds), their spacing kept; lines that are not events with a readable ``ts`` are left
    as they are (the service reports them by line number)."""
    from profiles.events import parse_ts

    parsed: list[tuple[dict[str, Any], float] | None] = []
    for line in lines:
        try:
            obj = json.loads(line)
            parsed.append((obj, parse_ts(obj["ts"])) if isinstance(obj, dict) else None)
        except (ValueError, KeyError, TypeError):
            parsed.append(None)
    stamps = [p[1] for p in parsed if p is not None]
    if not stamps:
        return lines
    shift = now - max(stamps)
    out = []
    for line, p in zip(lines, parsed, strict=True):
        if p is None:
            out.append(line)
        else:
            obj, ts = p
            out.append(json.dumps({**obj, "ts": round(ts + shift, 3)}) + "\n")
    return out


class EventPoster:
    """Posts batches to ``{url}/v1/events`` with one gateway key; ``say`` reports each retry
    (one line). `send` returns (accepted, rejected) and collects the rejected events'
    (line, error) in ``problems``; `PostFailed` when the service refused or could not be
    reached (its ``exit_status``: 2 for a request the service refuses, 1 otherwise)."""

    def __init__(
        self,
        client: httpx.Client,
        url: str,
        api_key: str,
        patience: float,
        retries: int | None,
        say: Callable[[str], None],
        patience_text: str = "",
    ) -> None:
        self.client, self.patience, self.retries, self.say = client, patience, retries, say
        self.endpoint = url.rstrip("/") + "/v1/events"
        self.headers = {
            "Authorization": f"Bearer {api_key}",
            "Content-Type": "application/x-ndjson",
        }
        self.patience_text = patience_text or f"{patience:g} s"
        self.waited = 0.0  # seconds spent waiting for the service, over the whole run
        self.problems: list[tuple[int, str]] = []

    def _attempt(self, body: bytes) -> httpx.Response:
        """The service's answer, retried while nothing was taken; raises once the patience
        is used up."""
        k = 0
        spent = 0.0  # waiting for this request
        while True:
            try:
                resp = self.client.post(self.endpoint, content=body, headers=self.headers)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing was sent
                why, after, got = f"cannot connect ({exc})", None, None
            except httpx.HTTPError as exc:  # sent: the service may have taken it, do not resend
                raise PostFailed(f"no answer from {self.endpoint}: {exc}", 1) from None
            else:
                if resp.status_code not in (429, 503):
                    return resp
                why, got = f"the service answered {answer(resp)}", resp
                after = parse_retry_after(resp.headers.get("Retry-After"))
            k += 1
            wait = retry_delay(k, after)
            out_of_tries = self.retries is not None and k > self.retries
            if out_of_tries or spent + wait > self.patience:
                wait = self.patience - spent  # the last wait fits the limit exactly
                if wait < 0.05 or out_of_tries:
                    if got is not None:
                        return got  # reported by send()
                    raise PostFailed(
                        f"cannot reach {self.endpoint}: {why}; gave up after {k} attempts "
                        f"and {spent:.1f} s of waiting (--retry-for {self.patience_text})",
                        1,
                    )
            of = f" of {self.retries}" if self.retries is not None else ""
            self.say(
                f"{why}; retry {k}{of} in {wait:.1f} s "
                f"(waited {spent:.1f} s so far, at most {self.patience:g} s)"
            )
            time.sleep(wait)
            spent += wait
            self.waited += wait

    def send(self, chunk: list[tuple[int, str]]) -> tuple[int, int]:
        body = "".join(line + "\n" for _, line in chunk).encode()
        resp = self._attempt(body)
        if resp.status_code == 413 and len(chunk) > 1:  # split until it fits
            half = len(chunk) // 2
            a = self.send(chunk[:half])
            b = self.send(chunk[half:])
            return a[0] + b[0], a[1] + b[1]
        data = resp.json() if resp.headers.get("content-type") == "application/json" else {}
        if resp.status_code in (202, 422) and "accepted" in data:
            for err in data.get("errors", []):
                self.problems.append((chunk[err["index"]][0], err["error"]))
            return data["accepted"], data["rejected"]
        msg = f"the service at {self.endpoint} answered {answer(resp)}"
        if resp.status_code in (429, 503):
            msg += (
                f" (gave up after waiting {self.waited:.1f} s in all; "
                f"--retry-for {self.patience_text})"
            )
        raise PostFailed(msg, 2 if resp.status_code in (400, 401, 403, 413) else 1)
