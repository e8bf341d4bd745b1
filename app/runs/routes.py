from fastapi import APIRouter

router = APIRouter(prefix="/v1/runs", tags=["runs"])
