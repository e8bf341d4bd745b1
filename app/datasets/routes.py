from __future__ import annotations

import orjson
from fastapi import APIRouter, Header, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.core.auth import current_user
from app.core.config import get_settings
from app.core.deps import CurrentUser, PageDep, SessionDep
from app.core.errors import BadRequest, Invalid
from app.core.idempotency import idempotent
from app.core.reads import body_of, typed
from app.datasets import service
from app.datasets.rejects import rejects_page
from app.datasets.schemas import DatasetList, DatasetRead
from contracts.bounds import ServerPath
from contracts.ingest import FORMAT_CHOICES
from contracts.inputs import MixSource

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


class DatasetFromPath(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    path: ServerPath
    # checked by the service (400 unknown_format, naming the choices)
    format: str = Field("auto", json_schema_extra={"enum": list(FORMAT_CHOICES)})


class MixCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    sources: list[MixSource] = Field(min_length=1, max_length=256)
    dedupe: bool = True
    seed: int = Field(0, ge=0, le=2**63 - 1)


# The body is read by hand (multipart or JSON), so its two shapes are declared for the schema.
UPLOAD_BODY = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": {
        "type": "object", "required": ["file"],
        "properties": {"file": {"type": "string", "format": "binary",
                                "description": "JSON Lines, JSON, Parquet; gzip/zstd allowed"},
                       "name": {"type": "string", "maxLength": 200},
                       "format": {"type": "string", "default": "auto",
                                  "enum": list(FORMAT_CHOICES)}}}},
    "application/json": {"schema": DatasetFromPath.model_json_schema()}}}}


@router.post("", status_code=201, openapi_extra=UPLOAD_BODY)
async def create_dataset(request: Request, session: SessionDep):
    # The token is checked here, not as a dependency, and before the body is read: no one
    # streams gigabytes to be told 401, and malformed JSON without a valid token is a 401 too,
    # as on the routes whose body FastAPI reads (app/core/auth.caller_before_body).
    user = await current_user(request)
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/form-data"):
        # The body itself is capped as it streams in (app/core/middleware.BodyLimitMiddleware).
        cap = get_settings().max_upload_bytes
        form = await request.form(max_part_size=cap + 1)
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise Invalid("multipart field 'file' is required", param="file", code="missing_file")
        name = str(form.get("name") or upload.filename or "dataset")
        fmt = str(form.get("format") or "auto")
        import asyncio

        d = await asyncio.to_thread(service.from_upload, session, user, name, upload.filename,
                                    upload.file, fmt)
        return body_of(DatasetRead.of(d), user)
    try:
        data = orjson.loads(await request.body())
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}", code="malformed_json") from e
    try:
        body = DatasetFromPath.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        msg = f"unknown field '{loc}'" if err["type"] == "extra_forbidden" else f"{loc}: {err['msg']}"
        raise Invalid(msg, param=loc) from e
    key = request.headers.get("idempotency-key")
    return idempotent(session, user, key, body.model_dump(), lambda: body_of(DatasetRead.of(
        service.from_path(session, user, body.name, body.path, body.format)), user))


@router.post("/mix", status_code=201, response_model=DatasetRead)
def mix(body: MixCreate, user: CurrentUser, session: SessionDep,
        idempotency_key: str | None = Header(None)):
    return idempotent(session, user, idempotency_key, body.model_dump(),
                      lambda: body_of(DatasetRead.of(service.mix(session, user, body)), user))


@router.get("", response_model=DatasetList)
def list_datasets(*, status: str | None = None, page: PageDep,
                  user: CurrentUser, session: SessionDep):
    rows, more, nxt = service.list_datasets(session, page, status=status)
    return typed(DatasetList(data=[DatasetRead.of(d) for d in rows], has_more=more,
                             next_after=nxt), user=user)


@router.get("/{ds_id}", response_model=DatasetRead)
def get_dataset(ds_id: str, user: CurrentUser, session: SessionDep):
    return typed(DatasetRead.of(service.get_dataset(session, ds_id)), user=user)


@router.get("/{ds_id}/rejects")
def get_rejects(*, ds_id: str, limit: int = Query(100, ge=1, le=1000), after: str | None = None,
                user: CurrentUser, session: SessionDep):
    """The dataset's rejected input records, `{"line", "reason"}` in input order, a page at
    a time (docs/API-additions.md)."""
    return rejects_page(session, service.get_dataset(session, ds_id), limit, after)


@router.delete("/{ds_id}", status_code=204)
def delete_dataset(ds_id: str, user: CurrentUser, session: SessionDep):
    service.delete_dataset(session, user, service.get_dataset(session, ds_id))
    return Response(status_code=204)
