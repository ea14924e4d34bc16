"""``iosim list``: the algorithms."""

from __future__ import annotations

from tabulate import tabulate

from iosim.runner import registry


def add_arguments(p) -> None:
    pass


def command(args) -> None:
    print(
        tabulate(
            [[a.name, a.title, a.citation] for a in registry.REGISTRY.values()], headers=["name", "what", "source"]
        )
    )
