"""`/v1/assets` (admin token): the asset registry over HTTP, with the functions `ens assets`
uses (`asset_store`, docs/assets.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from adapters.service import asset_store as ast
from adapters.service.assets import AssetError, parse_registry
from adapters.service.routes.base import Admin, ErrorOut, R
from profiles.alarm import SEVERITIES
from profiles.errors import ManyErrors

router = APIRouter()

KindQ = Annotated[str | None, Query(description="sensor or gateway (default: either)")]
_YAML = ("application/yaml", "application/x-yaml", "text/yaml", "application/json")
_MAX_BODY = 32 << 20  # a registry of ~100,000 assets


class ImportOut(BaseModel):
    added: int
    changed: int
    unchanged: int
    removed: int
    faults: int = Field(description="assets with a sensor-silent fault profile")
    profiles_written: int
    profiles_deleted: int


class ImportErrorOut(BaseModel):
    error: str
    errors: list[str] = Field(description="every problem, as `registry:LINE: ...`")


def _kind(kind: str | None) -> str | None:
    if kind not in (None, "sensor", "gateway"):
        raise HTTPException(422, f"kind {kind!r}: sensor or gateway")
    return kind


@router.get("/v1/assets", tags=["assets"])
def list_assets(_: Admin, r: R, kind: KindQ = None) -> list[dict[str, Any]]:
    """Every registered asset (`ens assets list`)."""
    k = _kind(kind)
    return [a for a in ast.list_assets(r) if k is None or a.get("kind") == k]


@router.get("/v1/assets/{aid}", tags=["assets"], responses={404: {"model": ErrorOut}})
def show_asset(aid: str, _: Admin, r: R, kind: KindQ = None) -> list[dict[str, Any]]:
    """The assets of that id (a sensor and a gateway may share one), each with its fault
    profile's id (`ens assets show`)."""
    found = ast.get_asset(r, aid, _kind(kind))
    if not found:
        raise HTTPException(404, f"no asset {aid!r}")
    return found


@router.post(
    "/v1/assets/import",
    response_model=ImportOut,
    tags=["assets"],
    responses={422: {"model": ImportErrorOut}, 413: {"model": ErrorOut}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "text/csv": {"schema": {"type": "string"}},
                "application/yaml": {"schema": {"type": "string"}},
            },
        }
    },
)
async def import_assets(
    request: Request,
    _: Admin,
    r: R,
    replace: Annotated[bool, Query(description="assets not in the body are removed")] = False,
    fault_severity: Annotated[str | None, Query(description="of the comm-fault alarms")] = None,
    fault_subscriber: Annotated[str | None, Query(description="of those alarms")] = None,
) -> Any:
    """Import a registry (`ens assets import`): CSV (``Content-Type: text/csv``) or YAML/JSON,
    checked whole; 422 listing every problem, and nothing stored."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype not in ("text/csv", *_YAML):
        raise HTTPException(
            415, f"Content-Type {ctype or '(none)'!r}: text/csv or application/yaml"
        )
    body = await request.body()
    if len(body) > _MAX_BODY:
        raise HTTPException(413, f"body over {_MAX_BODY} bytes")
    if fault_severity is not None and fault_severity not in SEVERITIES:
        raise HTTPException(
            422, f"fault_severity {fault_severity!r}: one of {', '.join(SEVERITIES)}"
        )
    try:
        reg = parse_registry(body.decode("utf-8-sig"), "registry", csv_format=ctype == "text/csv")
        res = ast.import_registry(
            r, reg, replace=replace, severity=fault_severity, subscriber=fault_subscriber
        )
    except UnicodeDecodeError:
        raise HTTPException(400, "body is not UTF-8") from None
    except (AssetError, ManyErrors) as exc:
        errors = [str(e) for e in exc.errors] if isinstance(exc, ManyErrors) else [str(exc)]
        msg = errors[0] if len(errors) == 1 else f"{len(errors)} problems; nothing stored"
        return JSONResponse({"error": msg, "errors": errors}, 422)
    return res.to_json()


@router.delete(
    "/v1/assets/{aid}", status_code=204, tags=["assets"], responses={404: {"model": ErrorOut}}
)
def remove_asset(aid: str, _: Admin, r: R, kind: Annotated[str, Query()] = "sensor") -> Response:
    """Remove an asset and its fault profile (`ens assets rm`)."""
    if not ast.get_asset(r, aid, _kind(kind)):
        raise HTTPException(404, f"no {kind} {aid!r}")
    ast.remove_assets(r, [ast.key(kind, aid)])
    return Response(status_code=204)
