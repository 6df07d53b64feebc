"""The sampling seed a request may carry, as every backend's server takes it."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

# A signed 64-bit integer (vLLM's bounds). Past them the embedded engine's generators fail, and with them every
# request that shares the generate call.
Seed = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
