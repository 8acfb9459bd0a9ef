"""``makemigrations`` that also writes the fence operations of ``Meta.fence`` changes."""

from django.core.management.commands import makemigrations

from fencekit.django.autodetect import FenceAutodetector


class Command(makemigrations.Command):
    autodetector = FenceAutodetector
