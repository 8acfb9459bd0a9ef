"""Install fencekit's core schema (``migrate fencekit zero`` removes it)."""

from typing import ClassVar

from django.db import migrations

from fencekit.django.operations import InstallFencekit


class Migration(migrations.Migration):
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[InstallFencekit]] = [InstallFencekit(core_version=1)]
