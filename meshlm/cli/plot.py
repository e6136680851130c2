"""Placeholder: being written (remove from meshlm/cli/main.py if it does not land)."""


def register(sub, add_config_args) -> None:
    pass
