from fastapi import APIRouter

router = APIRouter(prefix="/v1/plans", tags=["plans"])
