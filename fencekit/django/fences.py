"""``Meta.fence``: a fence declared on a Django model.

    class BillingSummary(models.Model):
        account = models.ForeignKey(Account, on_delete=models.CASCADE)
        total = models.DecimalField(max_digits=12, decimal_places=2)

        class Meta:
            fence = Fence(scope="key", key=["account"])

``makemigrations`` turns the declaration into ``ProtectTable`` / ``MoveFence`` /
``UnprotectTable`` operations (:mod:`fencekit.django.autodetect`). Key entries name model fields
(``account``) or their columns (``account_id``); the table is the model's ``db_table`` in
``schema`` (``public`` unless given). A :class:`Fence` is plain data: it resolves to a
:class:`~fencekit.spec.FenceSpec` against a model, and the spec is what migrations carry.

Django accepts only the ``Meta`` names listed in ``django.db.models.options.DEFAULT_NAMES``, and
a migration's model state copies only those (``django.db.migrations.state``). Adding ``fence``
to both lists is the one Django internal this integration relies on (django-pgtrigger does the
same for ``Meta.triggers``); it happens when this module is imported, before any model is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db.migrations import state as _migration_state
from django.db.models import options as _model_options

from fencekit.errors import SpecError
from fencekit.spec import DEFAULT_COLUMN, DEFAULT_SCHEMA, FenceSpec, Scope, TableName

__all__ = ["META_OPTION", "Fence", "fence_of", "spec_of"]

META_OPTION = "fence"


def _register_meta_option() -> None:
    for module in (_model_options, _migration_state):
        if META_OPTION not in module.DEFAULT_NAMES:
            module.DEFAULT_NAMES = (*module.DEFAULT_NAMES, META_OPTION)


_register_meta_option()


@dataclass(frozen=True)
class Fence:
    """How a model's table is fenced; the options of :class:`~fencekit.spec.FenceSpec`."""

    scope: Scope | str = Scope.ROW
    key: Sequence[str] = field(default=())
    resource: str | None = None
    on_missing: str = "reject"
    on_equal: str = "accept"
    column: str = DEFAULT_COLUMN
    lease_bound: bool = False
    issuer: str | None = None
    schema: str = DEFAULT_SCHEMA

    def __post_init__(self) -> None:
        object.__setattr__(self, "scope", Scope(self.scope))
        object.__setattr__(self, "key", tuple(self.key))

    def resolve(self, model: Any) -> FenceSpec:
        """The spec of this fence on ``model`` (a model class, real or from migration state)."""
        meta = model._meta
        columns = []
        for name in self.key:
            try:
                columns.append(meta.get_field(name).column)
            except Exception as exc:  # FieldDoesNotExist, or a relation with no column
                raise SpecError(
                    f"{meta.label}: Meta.fence key {name!r} is not a field of the model "
                    f"(fields: {', '.join(f.name for f in meta.concrete_fields)})"
                ) from exc
        return FenceSpec(
            table=TableName(self.schema, meta.db_table),
            scope=Scope(self.scope),
            key=tuple(columns),
            resource=self.resource,
            on_missing=self.on_missing,  # type: ignore[arg-type]  # FenceSpec validates it
            on_equal=self.on_equal,  # type: ignore[arg-type]
            column=self.column,
            lease_bound=self.lease_bound,
            issuer=self.issuer,
        )

    @classmethod
    def from_spec(cls, spec: FenceSpec) -> Fence:
        """The declaration a spec came from, its key as column names."""
        return cls(
            scope=spec.scope,
            key=spec.key,
            resource=spec.resource,
            on_missing=spec.on_missing,
            on_equal=spec.on_equal,
            column=spec.column,
            lease_bound=spec.lease_bound,
            issuer=spec.issuer,
            schema=spec.table.schema,
        )

    def deconstruct(self) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        """For Django's migration writer, should a ``Fence`` ever be written into a file."""
        defaults = Fence()
        kwargs = {
            name: getattr(self, name)
            for name in self.__dataclass_fields__
            if getattr(self, name) != getattr(defaults, name)
        }
        if "scope" in kwargs:
            kwargs["scope"] = str(kwargs["scope"])
        if "key" in kwargs:
            kwargs["key"] = list(kwargs["key"])
        return "fencekit.django.Fence", (), kwargs


def fence_of(model_state_or_model: Any) -> Fence | None:
    """The fence declared on a model, or recorded in a migration's model state."""
    options = getattr(model_state_or_model, "options", None)
    if isinstance(options, dict):
        value = options.get(META_OPTION)
    else:
        value = getattr(model_state_or_model._meta, META_OPTION, None)
    if value is not None and not isinstance(value, Fence):
        raise SpecError(f"Meta.fence must be a fencekit.django.Fence, not {value!r}")
    return value


def spec_of(model: Any) -> FenceSpec | None:
    """The spec of the fence declared on ``model`` (a model class), or None."""
    fence = fence_of(model)
    return None if fence is None else fence.resolve(model)
