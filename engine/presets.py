"""``-c/--config`` YAML presets: a mapping of flag names (``batch_size`` or ``batch-size``, or
an alias: ``model`` for ``arch``) to values, read as if its flags came first on the command
line, so argparse checks every value and the command line overrides it."""
from __future__ import annotations

import argparse
from typing import Callable

from engine import ConfigError

PRESET_BACKEND_KEYS = {"dali": "dali", "dummy": "synthetic"}  # a preset says `loader:`


def read_preset(path: str) -> dict:
    """The YAML mapping in ``path``, keys with ``-`` spelled ``_``. Raises :class:`ConfigError`."""
    import yaml

    try:
        with open(path) as f:
            preset = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--config {path}: {exc}".splitlines()[0]) from None
    if not isinstance(preset, dict):
        raise ConfigError(f"--config {path}: expected a mapping of flag names to values")
    return {str(k).replace("-", "_"): v for k, v in preset.items()}


class _PresetInvalid(Exception):
    """argparse's message about a preset's value (see :func:`preset_tokens`)."""


def _refuse(message: str):
    raise _PresetInvalid(message)


def preset_tokens(path: str, make_parser: Callable[[], argparse.ArgumentParser]
                  ) -> tuple[list[str], dict]:
    """A preset as ``(["--flag=value", ...], positionals)``: ``true`` booleans become their flag,
    ``false`` and null are left out; ``make_parser()`` builds the parser. Raises
    :class:`ConfigError` for an unknown key, ``dali:``/``dummy:`` or a value the flag refuses."""
    preset = read_preset(path)
    actions = {}
    for action in make_parser()._actions:
        if action.dest in ("help", "config"):
            continue
        actions[action.dest] = action  # and its long names: torchvision's model, test_only...
        for option in action.option_strings:
            if option.startswith("--"):
                actions.setdefault(option[2:].replace("-", "_"), action)
    unknown = sorted(set(preset) - set(actions))
    if unknown:
        raise ConfigError(f"--config {path}: unknown key(s) {', '.join(unknown)}")
    tokens, positionals = [], {}
    for key, value in preset.items():
        action = actions[key]
        if key in PRESET_BACKEND_KEYS:
            raise ConfigError(f"--config {path}: {key}: write loader: {PRESET_BACKEND_KEYS[key]}")
        if not action.option_strings:
            positionals[key] = value
        elif action.nargs == 0:  # store_true
            if not isinstance(value, bool):
                raise ConfigError(f"--config {path}: {key}: expected true or false, got {value!r}")
            tokens += [max(action.option_strings, key=len)] if value else []
        elif value is not None:
            tokens.append(f"{max(action.option_strings, key=len)}={value}")
    checker = make_parser()
    checker.error = _refuse  # argparse would print usage and exit; name the preset instead
    try:
        checker.parse_args(tokens)
    except _PresetInvalid as exc:
        raise ConfigError(f"--config {path}: {exc}") from None
    return tokens, positionals
