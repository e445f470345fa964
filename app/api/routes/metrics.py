"""Routes: metrics (to be written)."""

from fastapi import APIRouter

router = APIRouter()
