"""Rule selection and threshold overrides: ``advisor.toml``, ``--set RULE.param=value``, ``--rule``, ``--skip``."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(ValueError):
    """A bad override or config file."""


@dataclass
class Config:
    """What the user asked for."""

    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    select: list[str] = field(default_factory=list)
    skip: list[str] = field(default_factory=list)
    all_rules: bool = False

    def add_set(self, text: str) -> None:
        """Parse one ``RULE.param=value``."""
        if "=" not in text or "." not in text.split("=", 1)[0]:
            raise ConfigError(f"--set {text!r}: expected RULE.param=value, e.g. COM001.min_wait_ratio=0.4")
        key, value = text.split("=", 1)
        rule_id, param = key.split(".", 1)
        self.overrides.setdefault(rule_id.strip().upper(), {})[param.strip()] = value.strip()

    @classmethod
    def load(cls, path: Path | None) -> Config:
        """Read ``advisor.toml`` ([rules] select/skip, [thresholds.RULE] param = value)."""
        cfg = cls()
        if path is None:
            return cfg
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read config: {exc}") from None
        rules = data.get("rules", {})
        cfg.select = [str(x).upper() for x in rules.get("select", [])]
        cfg.skip = [str(x).upper() for x in rules.get("skip", [])]
        cfg.all_rules = bool(rules.get("all", False))
        for rid, params in data.get("thresholds", {}).items():
            if not isinstance(params, dict):
                raise ConfigError(f"{path}: [thresholds.{rid}] must be a table")
            cfg.overrides.setdefault(rid.upper(), {}).update(params)
        return cfg


def _coerce(value: Any, default: Any, where: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        if isinstance(default, bool):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        raise ConfigError(f"{where}: {value!r} is not a {type(default).__name__}") from None
    return value


def build_thresholds(rule_id: str, cls: type, overrides: dict[str, Any]) -> Any:
    """Instantiate a rule's Thresholds with overrides applied (unknown names are an error)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in overrides.items():
        if name not in fields:
            known = ", ".join(fields) or "none"
            raise ConfigError(f"{rule_id}.{name}: no such threshold (known: {known})")
        default = fields[name].default
        kwargs[name] = _coerce(value, default, f"{rule_id}.{name}")
    return cls(**kwargs)
