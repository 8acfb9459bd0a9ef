"""``migrate`` whose "your models have changes" check counts ``Meta.fence`` changes too."""

from django.core.management.commands import migrate

from fencekit.django.autodetect import FenceAutodetector


class Command(migrate.Command):
    autodetector = FenceAutodetector
