"""E-mail rendering (single notification and digest) and SMTP sending.

Mails are multipart/alternative: a plain-text part that reads well in any client and an HTML
part with the same content (every value HTML-escaped: event attributes come from sensors and
users). Message-IDs are derived from the delivery key, so a re-sent mail after a crash carries
the same Message-ID and mail clients can fold the duplicate.
"""

from __future__ import annotations

import hashlib
import html
import re
import smtplib
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any

from notifiers.attempt import Attempt
from notifiers.config import SmtpConfig
from notifiers.deadline import shutdown_socket
from notifiers.metrics import DEADLINES

Notification = Mapping[str, Any]


# C0 and C1 control characters and DEL: NUL, CR, LF, ESC, ... (str.split() misses NUL and ESC)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


# the same in a body, where line breaks and tabs are the text's own
_CONTROL_IN_BODY = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean_header(value: Any) -> str:
    """One line of printable text for a header built from event data: a line break would
    inject headers, and a NUL or other control character breaks or smuggles through mail
    software. Each becomes a space; runs of white space one."""
    return " ".join(_CONTROL.sub(" ", str(value)).split())


def fmt_ts(ts: Any, seconds: bool = True) -> str:
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        fmt = "%Y-%m-%d %H:%M:%S UTC" if seconds else "%Y-%m-%d %H:%M UTC"
        return datetime.fromtimestamp(ts, UTC).strftime(fmt)
    return "?" if ts is None else str(ts)


def _partition(n: Notification) -> str:
    part = n.get("partition") or {}
    return ", ".join(f"{k} {v}" for k, v in part.items()) if isinstance(part, Mapping) else ""


def _alarm_lines(n: Notification) -> list[str]:
    """An alarm message (docs/alarms.md): each notice, and how to acknowledge it."""
    alarm = n.get("alarm")
    if not isinstance(alarm, Mapping):
        return []
    lines = []
    for x in alarm.get("notices") or []:
        labels = ", ".join(f"{k}={v}" for k, v in (x.get("labels") or {}).items())
        ack = x.get("acknowledge") or {}
        lines += [
            f"Alarm {x.get('alarm')} (occurrence {x.get('occurrence')}): "
            f"{x.get('transition_kind')} -> {x.get('state')}, severity {x.get('severity')}",
            f"  {labels}",
            f"  count {x.get('count')}, first seen {fmt_ts(x.get('first_seen'))}, "
            f"last seen {fmt_ts(x.get('last_seen'))}",
            f"  acknowledge: {ack.get('command')}  or  {ack.get('http')}",
        ]
    if alarm.get("overflow"):
        lines.append(f"({alarm['overflow']} notices held back by the hourly cap)")
    return lines


def subject_for(n: Notification) -> str:
    """e.g. ``[ENS] p4 matched at 2024-03-01 22:10 UTC (room 101)``; an alarm message:
    ``[ENS] MAJOR p4 raise (room=101)``."""
    alarm = n.get("alarm")
    if isinstance(alarm, Mapping) and alarm.get("notices"):
        count = len(alarm["notices"])
        labels = alarm.get("labels") or {}
        where = ", ".join(
            f"{k}={v}" for k, v in labels.items() if k not in ("profile", "severity", "subscriber")
        )
        what = f"{alarm.get('transition_kind')} ({where})" if count == 1 else f"{count} alarms"
        return clean_header(
            f"[ENS] {str(alarm.get('severity', '')).upper()} {n.get('profile')} {what}"
        )
    where = _partition(n)
    subject = f"[ENS] {n.get('profile')} matched at {fmt_ts(n.get('ts'), seconds=False)}"
    return clean_header(f"{subject} ({where})" if where else subject)


def digest_subject(ns: Sequence[Notification]) -> str:
    counts: dict[str, int] = {}
    for n in ns:
        counts[str(n.get("profile"))] = counts.get(str(n.get("profile")), 0) + 1
    profiles = ", ".join(f"{p} ×{c}" if c > 1 else p for p, c in counts.items())
    tss = [n["ts"] for n in ns if isinstance(n.get("ts"), (int, float))]
    span = f" {fmt_ts(min(tss), False)} – {fmt_ts(max(tss), False)}" if tss else ""
    return clean_header(f"[ENS] {len(ns)} notifications ({profiles}){span}")


def _event_lines(n: Notification) -> list[str]:
    lines = []
    for name, ev in (n.get("events") or {}).items():
        ev = ev if isinstance(ev, Mapping) else {"id": ev}
        lines.append(f"  {name}: event {ev.get('id', '?')} at {fmt_ts(ev.get('ts'))}")
        lines += [f"      {k} = {v}" for k, v in ev.items() if k not in ("id", "ts")]
    return lines


def text_section(n: Notification) -> str:
    lines = [f"Profile {n.get('profile')} matched at {fmt_ts(n.get('ts'))}."]
    if where := _partition(n):
        lines.append(f"Partition: {where}")
    if n.get("subscriber"):
        lines.append(f"Subscriber: {n.get('subscriber')}")
    lines.append(f"Notification id: {n.get('id')}")
    if alarm := _alarm_lines(n):
        return "\n".join([*lines, "", *alarm])
    lines += ["", "Events:", *_event_lines(n)]
    return "\n".join(lines)


def html_section(n: Notification) -> str:
    e = html.escape
    out = [
        f"<h2>Profile <code>{e(str(n.get('profile')))}</code> matched at "
        f"{e(fmt_ts(n.get('ts')))}</h2>",
        "<p>",
    ]
    if where := _partition(n):
        out.append(f"Partition: <b>{e(where)}</b><br>")
    if n.get("subscriber"):
        out.append(f"Subscriber: {e(str(n.get('subscriber')))}<br>")
    out.append(f"Notification id: <code>{e(str(n.get('id')))}</code></p>")
    if alarm := _alarm_lines(n):
        out.append(f"<pre>{e(chr(10).join(alarm))}</pre>")
        return "\n".join(out)
    out.append('<table border="1" cellpadding="4" cellspacing="0">')
    out.append("<tr><th>component</th><th>event</th><th>time</th><th>attributes</th></tr>")
    for name, ev in (n.get("events") or {}).items():
        ev = ev if isinstance(ev, Mapping) else {"id": ev}
        attrs = "<br>".join(
            f"{e(str(k))} = {e(str(v))}" for k, v in ev.items() if k not in ("id", "ts")
        )
        out.append(
            f"<tr><td>{e(str(name))}</td><td>{e(str(ev.get('id', '?')))}</td>"
            f"<td>{e(fmt_ts(ev.get('ts')))}</td><td>{attrs}</td></tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def _html_doc(title: str, sections: Sequence[str]) -> str:
    body = "\n<hr>\n".join(sections)
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"</head><body>\n{body}\n</body></html>\n"
    )


def _message(
    subject: str, sender: str, to: str, text: str, html_doc: str, key: str
) -> EmailMessage:
    msg = EmailMessage()
    msg["Subject"] = subject
    msg["From"] = sender
    msg["To"] = to
    msg["Date"] = formatdate(usegmt=True)
    domain = sender.rpartition("@")[2] or "ens.local"
    msg["Message-ID"] = f"<ens.{hashlib.sha256(key.encode()).hexdigest()[:32]}@{domain}>"
    # a NUL (or ESC, a lone CR) of an event attribute must not reach the wire in a body either
    msg.set_content(_CONTROL_IN_BODY.sub(" ", text))
    msg.add_alternative(_CONTROL_IN_BODY.sub(" ", html_doc), subtype="html")
    return msg


SIGNATURE = "\n\n-- \nENS event notification service\n"


def build_message(n: Notification, sender: str, to: str, key: str | None = None) -> EmailMessage:
    """One notification; ``key`` (the delivery key) makes the Message-ID stable across resends."""
    key = key or str(n.get("id"))
    return build_parts(subject_for(n), text_section(n), html_section(n), sender, to, key)


def build_parts(
    subject: str, text: str, html_part: str, sender: str, to: str, key: str
) -> EmailMessage:
    """One notification's mail from its rendered parts (`notifiers.templates`): the subject
    made one clean line, the text signed, the HTML section put in a document."""
    subject = clean_header(subject)
    return _message(subject, sender, to, text + SIGNATURE, _html_doc(subject, [html_part]), key)


def build_digest(
    ns: Sequence[Notification],
    sender: str,
    to: str,
    texts: Sequence[str] | None = None,
    htmls: Sequence[str] | None = None,
) -> EmailMessage:
    """Several notifications for one recipient in one mail, oldest first; ``texts`` and
    ``htmls`` are their rendered sections (`notifiers.templates`), else the built-in ones."""
    subject = digest_subject(ns)
    head = f"{len(ns)} notifications:"
    texts = texts if texts is not None else [text_section(n) for n in ns]
    htmls = htmls if htmls is not None else [html_section(n) for n in ns]
    text = "\n\n".join([head, *(f"--- {i}.\n{t}" for i, t in enumerate(texts, 1))])
    key = "digest:" + ",".join(str(n.get("id")) for n in ns)
    sections = [f"<p>{html.escape(head)}</p>", *htmls]
    return _message(subject, sender, to, text + "\n", _html_doc(subject, sections), key)


def compose(
    build: Callable[..., EmailMessage], *args: Any, **kwargs: Any
) -> EmailMessage | Attempt:
    """The mail ``build(*args)`` makes, or a fatal Attempt when it cannot be made.

    Rendering depends only on the notification (a ``ts`` of 1e12 is a year datetime cannot
    show), so it fails the same way on every retry: such a delivery is dead-lettered at once.
    """
    try:
        return build(*args, **kwargs)
    except (ValueError, OverflowError, OSError, TypeError) as exc:
        return Attempt.fatal(f"cannot build the mail: {exc}")


def _smtp_attempt(exc: Exception) -> Attempt:
    """4xx replies and network trouble are worth retrying; 5xx replies are final."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        codes = [code for code, _ in exc.recipients.values()]
        error = "recipients refused: " + "; ".join(
            f"{r} {c} {m.decode(errors='replace') if isinstance(m, bytes) else m}"
            for r, (c, m) in exc.recipients.items()
        )
        return Attempt.retry(error) if all(400 <= c < 500 for c in codes) else Attempt.fatal(error)
    if isinstance(exc, smtplib.SMTPResponseException):
        msg = exc.smtp_error
        text = msg.decode(errors="replace") if isinstance(msg, bytes) else str(msg)
        error = f"SMTP {exc.smtp_code} {text}"
        return Attempt.retry(error) if 400 <= exc.smtp_code < 500 else Attempt.fatal(error)
    if isinstance(exc, smtplib.SMTPNotSupportedError):
        return Attempt.fatal(f"SMTP server does not support it: {exc}")
    if isinstance(exc, ValueError):
        return Attempt.fatal(f"cannot build the mail: {exc}")
    return Attempt.retry(f"{type(exc).__name__}: {exc}")


_SESSION: ContextVar[_Session | None] = ContextVar("ens_smtp_session", default=None)


class _Session:
    """One SMTP session's total deadline: a timer shuts its socket when it passes.

    smtplib's timeout is per socket operation, so a relay that trickles a reply (or takes the
    message and never answers the end of DATA) holds the session for ever; shutting the socket
    wakes the blocked read wherever smtplib is.
    """

    def __init__(self, deadline: float) -> None:
        self.started = time.monotonic()
        self.phase = "connect"
        self.expired = self.abandoned = False
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(deadline, self.cut)
        self._timer.daemon = True
        self._timer.start()

    def watch(self, sock: socket.socket | None) -> None:
        with self._lock:
            if sock is not None:
                self._socks.append(sock)
            cut = self.expired or self.abandoned
        if cut:
            shutdown_socket(sock)

    def cut(self, abandon: bool = False) -> None:
        with self._lock:
            if abandon:
                self.abandoned = True
            else:
                self.expired = True
            socks = list(self._socks)
        for sock in socks:
            shutdown_socket(sock)

    def end(self) -> None:
        self._timer.cancel()

    def elapsed(self) -> float:
        return time.monotonic() - self.started


class _Watched:
    """Registers each socket smtplib opens (before it reads the greeting) with the session,
    and keeps the server's last reply (the answer to the message: `ens subscriber test`)."""

    last_reply: tuple[int, bytes] | None = None

    def getreply(self) -> tuple[int, bytes]:
        reply: tuple[int, bytes] = super().getreply()  # type: ignore[misc]
        self.last_reply = reply
        return reply

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        sock: socket.socket = super()._get_socket(host, port, timeout)  # type: ignore[misc]
        session = _SESSION.get()
        if session is not None:
            session.watch(sock)
        return sock


class _SMTP(_Watched, smtplib.SMTP):
    pass


class _SMTPSSL(_Watched, smtplib.SMTP_SSL):
    pass


class SmtpSender:
    """Sends one message per SMTP session: simple, and a broken session never leaks into the next.

    A session ends by ``config.deadline`` however slowly the relay answers. Cut off after the
    message was sent (no reply to the end of DATA), the mail may have been taken: the retry
    sends it again with the same Message-ID, which mail clients fold (at-least-once).
    """

    def __init__(self, config: SmtpConfig | None = None) -> None:
        self.config = config or SmtpConfig()
        self._live: set[_Session] = set()
        self._lock = threading.Lock()
        self._aborted = False

    def abort(self) -> int:
        """End the sessions in flight now (the worker is stopping); returns how many."""
        with self._lock:
            self._aborted = True
            live = list(self._live)
        for session in live:
            session.cut(abandon=True)
        return len(live)

    def send(self, msg: EmailMessage) -> Attempt:
        c = self.config
        if self._aborted:
            return Attempt.abandon("abandoned: the worker is shutting down")
        session = _Session(c.deadline)
        token = _SESSION.set(session)
        with self._lock:
            self._live.add(session)
        try:
            return self._send(msg, session)
        finally:
            session.end()
            _SESSION.reset(token)
            with self._lock:
                self._live.discard(session)

    def _send(self, msg: EmailMessage, session: _Session) -> Attempt:
        c = self.config
        timeout = min(c.timeout, c.deadline)
        reply: tuple[int, bytes] | None = None
        try:
            if c.security == "tls":
                smtp: smtplib.SMTP = _SMTPSSL(
                    c.host, c.effective_port, timeout=timeout, context=c.ssl_context()
                )
            else:
                smtp = _SMTP(c.host, c.effective_port, timeout=timeout)
            with smtp:
                session.phase = "greeting"
                smtp.ehlo()
                if c.security == "starttls":
                    # never fall back to plain text when STARTTLS is asked for
                    session.phase = "starttls"
                    smtp.starttls(context=c.ssl_context())
                    session.watch(smtp.sock)  # the TLS socket replaces the plain one
                    smtp.ehlo()
                if c.username:
                    session.phase = "login"
                    password = c.password.get_secret_value() if c.password else ""
                    smtp.login(c.username, password)
                session.phase = "data"  # MAIL FROM, RCPT TO, DATA and the message
                smtp.send_message(msg)
                reply = getattr(smtp, "last_reply", None)  # the answer to the end of DATA
                session.phase = "quit"
        except (OSError, ValueError) as exc:  # smtplib.SMTPException is an OSError
            if session.abandoned:
                return Attempt.abandon("abandoned: the worker is shutting down")
            if session.expired:
                DEADLINES.labels("email", session.phase).inc()
                return Attempt.retry(
                    f"deadline exceeded after {session.elapsed():.1f} s in the {session.phase} "
                    f"phase (ENS_SMTP_DEADLINE={c.deadline:g})"
                )
            return _smtp_attempt(exc)
        answer = f": {reply[0]} {reply[1].decode(errors='replace')}" if reply else ""
        return Attempt.success(f"SMTP {c.host}:{c.effective_port}{answer}")
