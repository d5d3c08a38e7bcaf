"""The OpenAI Files API subset the SDK uses for retrieval: create, list, retrieve, content, delete."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from ortserve.errors import InvalidRequest, PayloadTooLarge
from ortserve.rag.ingest import safe_filename
from ortserve.server import published
from ortserve.server.pagination import page
from ortserve.server.rag_access import locked, rag_of
from ortserve.server.state import state_of
from ortserve.server.tenancy import claimed, mine, own_file_path

router = APIRouter()
my_file = [Depends(own_file_path)]   # another key's file answers the 404 of a missing one
PURPOSES = ("assistants", "user_data")
# what rag/ingest reads (by the name's extension; a 400 lists them): published as the file's media types
UPLOAD_TYPES = "text/plain, text/markdown, text/csv, text/html, application/json, application/pdf"


@router.post("/v1/files", openapi_extra=published.multipart(["file", "purpose"], UPLOAD_TYPES, file=published.FILE,
                                                              purpose={"enum": list(PURPOSES)}))
async def create_file(request: Request) -> dict[str, Any]:
    st = state_of(request)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        await request.body()  # read it first (up to the upload limit): an oversized body is a 413, whatever its type
        raise InvalidRequest("upload files as multipart/form-data with fields 'file' and 'purpose'", param="file")
    limit = st.settings.max_upload_bytes
    form = await request.form(max_files=1, max_fields=4)
    try:
        upload, purpose = form.get("file"), form.get("purpose")
        if upload is None or isinstance(upload, str):
            raise InvalidRequest("'file' is required (a multipart file field)", param="file",
                                 code="missing_required_parameter")
        if purpose not in PURPOSES:
            raise InvalidRequest(f"'purpose' must be one of {', '.join(PURPOSES)}, got {purpose!r}", param="purpose")
        unknown = set(form.keys()) - {"file", "purpose"}
        if unknown:
            raise InvalidRequest(f"unknown field(s): {', '.join(sorted(unknown))}", param=min(unknown),
                                 code="unknown_parameter")
        name = safe_filename(upload.filename)
        data = await upload.read(limit + 1)
        if len(data) > limit:
            raise PayloadTooLarge(f"{name} is larger than this server's upload limit of {limit} bytes",
                                  hint="raise ORTSERVE_MAX_UPLOAD_BYTES, or ingest it with `ortserve rag ingest`")
    finally:
        await form.close()
    rag = rag_of(request)
    return await claimed(request, "files", await asyncio.to_thread(rag.add_file, name, data, str(purpose)))


@router.get("/v1/files")
async def list_files(request: Request) -> dict[str, Any]:
    data = await mine(request, "files", await locked(rag_of(request).files))
    purpose = request.query_params.get("purpose")
    if purpose is not None:
        data = [f for f in data if f.get("purpose") == purpose]
    return page(request, data, default_limit=10000, max_limit=10000, known=("purpose",))


@router.get("/v1/files/{file_id}", dependencies=my_file)
async def retrieve_file(file_id: str, request: Request) -> dict[str, Any]:
    return await locked(rag_of(request).file, file_id)  # type: ignore[no-any-return]


@router.get("/v1/files/{file_id}/content", dependencies=my_file)
async def file_content(file_id: str, request: Request) -> Response:
    data = await locked(rag_of(request).file_bytes, file_id)
    return Response(data, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}", dependencies=my_file)
async def delete_file(file_id: str, request: Request) -> dict[str, Any]:
    return await locked(rag_of(request).delete_file, file_id)  # type: ignore[no-any-return]
