"""An ASGI view that writes under the token the request carries, as a worker's webhook might."""

from django.db import DatabaseError
from django.db.models import F
from django.http import HttpRequest, JsonResponse

from fencekit import StaleTokenError, fencing
from fencekit.errors import translate

from .models import BillingSummary


async def bump(request: HttpRequest, account_id: int, token: int) -> JsonResponse:
    try:
        async with fencing(token):
            updated = await BillingSummary.objects.filter(account_id=account_id).aupdate(
                total=F("total") + 1
            )
    except DatabaseError as exc:
        error = translate(exc.__cause__) if exc.__cause__ is not None else None
        if isinstance(error, StaleTokenError):
            return JsonResponse({"rejected": error.reason, "fence": error.fence}, status=409)
        raise
    return JsonResponse({"updated": updated})
