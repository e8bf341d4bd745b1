"""The dashboard: one static page (`index.html`, plain JS over the HTTP API, refreshed every
2 s) with runs and their stages, jobs, the queue, nodes and GPUs, datasets, and per job its
progress (done/total, rate, ETA), metrics, events and log. The page itself needs no token;
every call it makes sends the one the user pastes (kept in the browser's localStorage)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, RedirectResponse

router = APIRouter(include_in_schema=False)


@cache
def _page() -> str:
    return (Path(__file__).with_name("index.html")).read_text(encoding="utf-8")


@router.get("/ui")
def dashboard() -> HTMLResponse:
    return HTMLResponse(_page(), headers={"Cache-Control": "no-cache"})


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui")
