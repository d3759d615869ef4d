"""Profiles, gateways and deliveries (management only)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
