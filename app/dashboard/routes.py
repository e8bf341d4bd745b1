"""The dashboard: one static page (`index.html` with `app.js` and `app.css`, plain JS over the
HTTP API, refreshed every 2 s) with runs and their stages, jobs, the queue, nodes and GPUs,
datasets, and per job its progress (done/total, rate, ETA), metrics, events and log. The page
itself needs no token; every call it makes sends the one the user pastes (kept in the
browser's localStorage).

The page is served under a Content-Security-Policy with no inline script: a
job name rendered into it can never run as code, and no other site may frame it. The API docs
(`/docs`) are Swagger UI served from the `swagger-ui-bundle` package, so they work offline and
load nothing from a CDN."""

from __future__ import annotations

import html
from functools import cache
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from app.core.config import get_settings
from app.core.errors import NotFound

router = APIRouter(include_in_schema=False)
HERE = Path(__file__).parent
ASSETS = {"app.js": "text/javascript", "storage.js": "text/javascript",
          "actions.js": "text/javascript", "app.css": "text/css"}
# style-src-attr: the progress bars set their width in a style attribute (a number computed
# by the script, never text from the API); everything else comes from this origin only.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; "
       "style-src-attr 'unsafe-inline'; connect-src 'self'; img-src 'self' data: blob:; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
UI_HEADERS = {"Cache-Control": "no-cache", "Content-Security-Policy": CSP,
              "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff"}


@cache
def _asset(name: str) -> bytes:
    return (HERE / name).read_bytes()


@router.get("/ui")
def dashboard() -> HTMLResponse:
    # The token prompt names the server's real token file (it said
    # ~/.draftyard/admin_token whatever DRAFTYARD_HOME was).
    tok = html.escape(str(get_settings().home / "admin_token"), quote=True)
    page = _asset("index.html").replace(b"<body>", f'<body data-token-file="{tok}">'.encode())
    return HTMLResponse(page, headers=UI_HEADERS)


@router.get("/ui/{name}")
def dashboard_asset(name: str) -> Response:
    if name not in ASSETS:
        raise NotFound(f"no dashboard file {name!r}", param="name")
    return Response(_asset(name), media_type=ASSETS[name], headers=UI_HEADERS)


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui")


def _swagger_dir() -> Path:
    import swagger_ui_bundle

    return Path(swagger_ui_bundle.swagger_ui_path)


@router.get("/docs")
def docs(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    return get_swagger_ui_html(openapi_url=f"{root}/openapi.json", title="draftyard API",
                               swagger_js_url=f"{root}/docs/assets/swagger-ui-bundle.js",
                               swagger_css_url=f"{root}/docs/assets/swagger-ui.css",
                               swagger_favicon_url=f"{root}/docs/assets/favicon-32x32.png")


@router.get("/docs/assets/{name}")
def docs_asset(name: str) -> FileResponse:
    if name not in ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png"):
        raise NotFound(f"no docs file {name!r}", param="name")
    return FileResponse(_swagger_dir() / name, headers={"Cache-Control": "max-age=86400"})


@router.get("/redoc")
def redoc() -> RedirectResponse:
    # ReDoc's page loads its script from a CDN; the offline docs are /docs.
    return RedirectResponse("/docs")
