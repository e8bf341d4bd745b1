"""draftyard's Python client: `from draftyard import Client` (see `draftyard.client`)."""

from draftyard.client import Client, resolve_settings
from draftyard.errors import (ApiError, BadRequest, Conflict, Forbidden, NotFound,
                              PayloadTooLarge, ServerError, Unauthorized, Unavailable,
                              Unprocessable)

__all__ = ["ApiError", "BadRequest", "Client", "Conflict", "Forbidden", "NotFound",
           "PayloadTooLarge", "ServerError", "Unauthorized", "Unavailable", "Unprocessable",
           "resolve_settings"]
