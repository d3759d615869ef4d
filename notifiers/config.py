"""Notifier configuration: SMTP, webhooks, retry policy, digest and worker tuning.

Load order: defaults < YAML/JSON file (``ENS_NOTIFIERS_CONFIG`` or an explicit path) < env vars,
so a deployment can keep a file and still inject secrets such as ``ENS_SMTP_PASSWORD`` from env.
"""

from __future__ import annotations

import os
import random
import socket
import ssl
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)

from notifiers.errors import ConfigError as ConfigError  # its old import path
from profiles.options import duration_value

Seconds = Annotated[float, BeforeValidator(duration_value)]
"""Seconds that a file or variable may also write as a duration: ``500ms``, ``2s``, ``5m``, ..."""

_DEFAULT_PORTS = {"starttls": 587, "tls": 465, "none": 25}
_SECRET_WORDS = ("password", "secret")


def describe_errors(
    exc: ValidationError | Sequence[Mapping[str, Any]],
    where: Callable[[tuple[Any, ...]], str] | None = None,
) -> str:
    """Pydantic errors (or their ``errors()`` list) as one clause per problem: ``where: what
    (got value)``, joined by ``; ``.

    ``where`` names a location (default: its dotted path). Values of password/secret fields
    are never echoed.
    """
    lines = []
    errors = exc.errors(include_url=False) if isinstance(exc, ValidationError) else exc
    for err in errors:
        loc = tuple(err["loc"])
        name = where(loc) if where else ".".join(str(x) for x in loc) or "value"
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        value = err.get("input")
        secret = any(w in str(x).lower() for x in loc for w in _SECRET_WORDS)
        if (
            err["type"] != "missing"
            and not secret
            and isinstance(value, str | int | float)
            and repr(value) not in msg
        ):
            msg += f" (got {value!r})"
        lines.append(f"{name}: {msg}")
    return "; ".join(lines)


class SmtpConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str = "localhost"
    port: int | None = Field(default=None, description="default: 587 starttls, 465 tls, 25 none")
    security: Literal["starttls", "tls", "none"] = "starttls"
    username: str | None = None
    password: SecretStr | None = None
    sender: str = "ens@localhost"
    timeout: Seconds = Field(default=10.0, gt=0, description="per read/write of the session")
    deadline: Seconds = Field(
        default=60.0,
        gt=0,
        description="total seconds for one SMTP session, connect to QUIT (the DATA phase "
        "included); a relay that trickles its replies is cut off then",
    )
    ca_file: str | None = Field(default=None, description="extra CA bundle, e.g. a private relay")
    verify: bool = True

    @field_validator("security", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.strip().lower() if isinstance(v, str) else v

    @property
    def effective_port(self) -> int:
        return self.port or _DEFAULT_PORTS[self.security]

    def ssl_context(self) -> ssl.SSLContext:
        return _ssl_context(self.ca_file, self.verify)


class WebhookConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    connect_timeout: Seconds = Field(default=5.0, gt=0)
    timeout: Seconds = Field(
        default=10.0,
        gt=0,
        description="total deadline of one request: connect, send, headers and the first few "
        "KB of the body (the rest is not read); a slower receiver counts as a failure",
    )
    ca_file: str | None = None
    verify: bool = True
    user_agent: str = "ens-notifier/0.1"
    per_destination: int | None = Field(
        default=None,
        ge=1,
        description="most requests in flight to one scheme://host:port; "
        "default: a quarter of the worker concurrency",
    )
    breaker_failures: int = Field(
        default=5,
        ge=0,
        description="consecutive failed attempts that open a destination's circuit; 0 = off",
    )
    breaker_cooldown: Seconds = Field(
        default=30.0, gt=0, description="seconds an open circuit sends nothing before a probe"
    )

    def ssl_context(self) -> ssl.SSLContext:
        return _ssl_context(self.ca_file, self.verify)


class RetryPolicy(BaseModel):
    """Exponential backoff with full jitter: a failed attempt k waits U(0, min(cap, base*2^(k-1))),
    at least a Retry-After (`notifiers.backoff`)."""

    model_config = ConfigDict(extra="forbid")
    base: Seconds = Field(default=1.0, gt=0)
    cap: Seconds = Field(default=300.0, gt=0)
    max_attempts: int = Field(default=8, ge=1)
    max_retry_after: Seconds = Field(
        default=3600.0, ge=0, description="upper bound on a receiver's Retry-After"
    )

    def delay(
        self, attempts: int, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float:
        """Seconds to wait after ``attempts`` failed attempts (`notifiers.backoff`: a
        Retry-After answer is the least wait)."""
        from notifiers.backoff import retry_delay

        return retry_delay(attempts, retry_after, self.base, self.cap, self.max_retry_after, rng)


class WorkerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    consumer: str = Field(
        default_factory=socket.gethostname,
        description="consumer name in the group; keep it stable so a restart re-claims its work",
    )
    batch: int = Field(default=64, ge=1)
    concurrency: int = Field(default=8, ge=1)
    poll: Seconds = Field(default=1.0, gt=0, description="longest idle wait between polls")
    lease: Seconds = Field(
        default=10.0,
        gt=0,
        le=86400,
        description="a taken delivery is retried by anyone after this; renewed every third "
        "of it while its send runs, so a dead worker's deliveries come back this soon",
    )
    shutdown_grace: Seconds = Field(
        default=5.0,
        ge=0,
        description="at shutdown, sends still in flight after this are abandoned (their "
        "leases bring them back); the worker stops within it plus about a second",
    )
    claim_idle: Seconds = Field(
        default=60.0, ge=0, description="take over other consumers' entries idle this long"
    )
    delivered_ttl: Annotated[int, BeforeValidator(duration_value)] = Field(
        default=7 * 86400, ge=1, description="idempotency memory (whole seconds)"
    )
    digest_max: int = Field(default=200, ge=1, description="most notifications in one digest")
    outbox_retention: Seconds = Field(
        default=86400.0,
        ge=0,
        description="drop acknowledged outbox entries older than this; 0 = keep",
    )


class NotifierConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    smtp: SmtpConfig = Field(default_factory=SmtpConfig)
    webhook: WebhookConfig = Field(default_factory=WebhookConfig)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    digest: Seconds = Field(default=0.0, ge=0, description="default digest window (s); 0 = off")

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, base: Mapping[str, Any] | None = None
    ) -> NotifierConfig:
        """``base`` (e.g. a parsed file) overridden by the ``ENS_*`` variables in `ENV_VARS`."""
        env = os.environ if env is None else env
        data: dict[str, Any] = {k: dict(v) for k, v in (base or {}).items() if isinstance(v, dict)}
        data.update({k: v for k, v in (base or {}).items() if not isinstance(v, dict)})
        for var, path in ENV_VARS.items():
            value = env.get(var)
            if value is None or value == "":
                continue
            if len(path) == 1:
                data[path[0]] = value
            else:
                data.setdefault(path[0], {})[path[1]] = value
        return cls.model_validate(data)

    @classmethod
    def load(
        cls, path: str | Path | None = None, env: Mapping[str, str] | None = None
    ) -> NotifierConfig:
        """Defaults < the file (``path`` or ``ENS_NOTIFIERS_CONFIG``) < ``ENS_*`` variables.

        Raises `ConfigError` naming the setting and where it came from (variable or file).
        """
        env = os.environ if env is None else env
        path = path or env.get("ENS_NOTIFIERS_CONFIG") or None
        base: Any = None
        if path:
            try:
                base = yaml.safe_load(Path(path).read_text())
            except OSError as exc:
                raise ConfigError(f"notifier config {path}: {exc.strerror or exc}") from None
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
                problem = getattr(exc, "problem", None) or exc
                raise ConfigError(
                    f"notifier config {path}: not valid YAML/JSON{at}: {problem}"
                ) from None
            if base is not None and not isinstance(base, dict):
                raise ConfigError(
                    f"notifier config {path}: expected a mapping of settings "
                    f"(smtp, webhook, retry, digest, worker)"
                )
        by_path = {p: var for var, p in ENV_VARS.items() if env.get(var)}

        def where(loc: tuple[Any, ...]) -> str:
            name = ".".join(str(x) for x in loc)
            var = by_path.get(tuple(loc))
            return f"{var} ({name})" if var else f"{name} in {path}" if path else name

        try:
            return cls.from_env(env, base or {})
        except ValidationError as exc:
            raise ConfigError("notifier config: " + describe_errors(exc, where)) from None


ENV_VARS: dict[str, tuple[str, ...]] = {
    "ENS_SMTP_HOST": ("smtp", "host"),
    "ENS_SMTP_PORT": ("smtp", "port"),
    "ENS_SMTP_SECURITY": ("smtp", "security"),
    "ENS_SMTP_USER": ("smtp", "username"),
    "ENS_SMTP_PASSWORD": ("smtp", "password"),
    "ENS_SMTP_FROM": ("smtp", "sender"),
    "ENS_SMTP_TIMEOUT": ("smtp", "timeout"),
    "ENS_SMTP_DEADLINE": ("smtp", "deadline"),
    "ENS_SMTP_CA_FILE": ("smtp", "ca_file"),
    "ENS_SMTP_VERIFY": ("smtp", "verify"),
    "ENS_WEBHOOK_CONNECT_TIMEOUT": ("webhook", "connect_timeout"),
    "ENS_WEBHOOK_TIMEOUT": ("webhook", "timeout"),
    "ENS_WEBHOOK_CA_FILE": ("webhook", "ca_file"),
    "ENS_WEBHOOK_VERIFY": ("webhook", "verify"),
    "ENS_WEBHOOK_PER_DESTINATION": ("webhook", "per_destination"),
    "ENS_WEBHOOK_BREAKER_FAILURES": ("webhook", "breaker_failures"),
    "ENS_WEBHOOK_BREAKER_COOLDOWN": ("webhook", "breaker_cooldown"),
    "ENS_RETRY_BASE": ("retry", "base"),
    "ENS_RETRY_CAP": ("retry", "cap"),
    "ENS_RETRY_MAX_ATTEMPTS": ("retry", "max_attempts"),
    "ENS_RETRY_MAX_RETRY_AFTER": ("retry", "max_retry_after"),
    "ENS_DIGEST_SECONDS": ("digest",),
    "ENS_WORKER_NAME": ("worker", "consumer"),
    "ENS_WORKER_BATCH": ("worker", "batch"),
    "ENS_WORKER_CONCURRENCY": ("worker", "concurrency"),
    "ENS_WORKER_POLL": ("worker", "poll"),
    "ENS_WORKER_LEASE": ("worker", "lease"),
    "ENS_WORKER_CLAIM_IDLE": ("worker", "claim_idle"),
    "ENS_WORKER_SHUTDOWN_GRACE": ("worker", "shutdown_grace"),
    "ENS_DELIVERED_TTL": ("worker", "delivered_ttl"),
    "ENS_OUTBOX_RETENTION": ("worker", "outbox_retention"),
}


def _ssl_context(ca_file: str | None, verify: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    if ca_file:
        ctx.load_verify_locations(cafile=ca_file)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
