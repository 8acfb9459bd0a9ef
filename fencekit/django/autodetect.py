"""``makemigrations`` for ``Meta.fence``: a migration autodetector that compares fences.

Django 5.2 lets the ``makemigrations`` and ``migrate`` commands name their autodetector
(``Command.autodetector``); the ``fencekit`` app's commands name :class:`FenceAutodetector`.
It resolves each model's fence to a :class:`~fencekit.spec.FenceSpec` in the old state (what
earlier migrations' operations recorded) and the new one (the models' ``Meta.fence``), and writes:

- ``UnprotectTable`` before Django's own operations, for a fence removed or a model deleted;
- ``ProtectTable`` after them, for a fence added or a model created with one (after the model
  and its key fields exist);
- ``MoveFence`` after them, for a changed fence (fences carried over).

Every migration holding one of them depends on the ``fencekit`` app's install migration. A
second ``makemigrations`` finds the recorded fences equal to the declared ones: no changes.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError
from django.db.migrations.autodetector import MigrationAutodetector, OperationDependency

from fencekit.django.fences import META_OPTION, fence_of
from fencekit.django.grants import add_writer_grants
from fencekit.django.operations import MoveFence, ProtectTable, UnprotectTable
from fencekit.spec import FenceSpec

__all__ = ["FenceAutodetector"]

#: The ``fencekit`` app migration that installs the core every fence needs.
INSTALL_MIGRATION = ("fencekit", "0001_install")

_Key = tuple[str, str]


class FenceAutodetector(MigrationAutodetector):
    """Django's autodetector, plus the fence operations (see the module docstring)."""

    def generate_renamed_models(self) -> None:
        super().generate_renamed_models()
        # Every spec is resolved now, while both states still hold Meta.fence (created
        # models lose it below: CreateModel must not carry it).
        self._fence_old: dict[_Key, FenceSpec] = {}
        self._fence_new: dict[_Key, FenceSpec] = {}
        for key in self.old_model_keys:
            spec = self._spec(self.from_state, key)
            if spec is not None:
                self._fence_old[key] = spec
        for key in self.new_model_keys:
            spec = self._spec(self.to_state, key)
            if spec is not None:
                self._fence_new[key] = spec

    @staticmethod
    def _spec(state: Any, key: _Key) -> FenceSpec | None:
        if fence_of(state.models[key]) is None:
            return None
        model = state.apps.get_model(*key)
        fence = fence_of(model)
        return None if fence is None else fence.resolve(model)

    def _old_key(self, new_key: _Key) -> _Key:
        app_label, model_name = new_key
        return app_label, self.renamed_models.get(new_key, model_name)

    def generate_deleted_models(self) -> None:
        # Unprotect first: the fence's functions and registry row outlive a dropped table.
        kept_old = {self._old_key(k): k for k in self.new_model_keys}
        for old_key, old_spec in sorted(self._fence_old.items()):
            new_key = kept_old.get(old_key)
            new_spec = None if new_key is None else self._fence_new.get(new_key)
            if new_spec is None:
                op = UnprotectTable.generate(self._name(self.from_state, old_key), old_spec)
                self.add_operation(old_key[0], op)
            elif new_spec.table != old_spec.table:
                raise CommandError(
                    f"{old_key[0]}.{old_key[1]}: the fenced table {old_spec.table} becomes "
                    f"{new_spec.table}, and makemigrations does not move a fence to a renamed "
                    "table: see docs/django.md, 'Renaming a fenced table'"
                )
        super().generate_deleted_models()

    def generate_created_models(self) -> None:
        created = self.new_model_keys - self.old_model_keys
        for key in created:
            self.to_state.models[key].options.pop(META_OPTION, None)
        super().generate_created_models()
        for key in sorted(created):
            spec = self._fence_new.get(key)
            if spec is None:
                continue
            model_name = self._name(self.to_state, key)
            deps = [OperationDependency(key[0], key[1], None, OperationDependency.Type.CREATE)]
            deps += self._key_field_deps(key, spec)
            self.add_operation(key[0], ProtectTable.generate(model_name, spec), dependencies=deps)

    def generate_added_fields(self) -> None:
        super().generate_added_fields()
        for new_key in sorted(self.kept_model_keys):
            new_spec = self._fence_new.get(new_key)
            old_spec = self._fence_old.get(self._old_key(new_key))
            if new_spec is None or new_spec == old_spec:
                continue
            model_name = self._name(self.to_state, new_key)
            deps = self._key_field_deps(new_key, new_spec)
            if old_spec is None:
                op: Any = ProtectTable.generate(model_name, new_spec)
            else:
                op = MoveFence.generate(model_name, old_spec, new_spec)
            self.add_operation(new_key[0], op, dependencies=deps)
        add_writer_grants(self, self._graph, sorted({k[0] for k in self._fence_new}))

    def _key_field_deps(self, key: _Key, spec: FenceSpec) -> list[OperationDependency]:
        model = self.to_state.apps.get_model(*key)
        columns = set(spec.key)
        return [
            OperationDependency(key[0], key[1], f.name, OperationDependency.Type.CREATE)
            for f in model._meta.concrete_fields
            if f.column in columns
        ]

    @staticmethod
    def _name(state: Any, key: _Key) -> str:
        return str(state.models[key].name)

    def _detect_changes(self, convert_apps: Any = None, graph: Any = None) -> Any:
        self._graph = graph
        migrations = super()._detect_changes(convert_apps, graph)
        fence_ops = (ProtectTable, UnprotectTable, MoveFence)
        for app_label, app_migrations in migrations.items():
            if app_label == INSTALL_MIGRATION[0]:
                continue
            for migration in app_migrations:
                fenced = any(isinstance(op, fence_ops) for op in migration.operations)
                if fenced and INSTALL_MIGRATION not in migration.dependencies:
                    migration.dependencies.append(INSTALL_MIGRATION)
        return migrations
