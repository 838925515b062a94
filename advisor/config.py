"""Rule selection and threshold overrides: ``advisor.toml``, ``--set RULE.param=value``, ``--rule``, ``--skip``."""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
from collections.abc import Iterable, Mapping
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
    #: the config file read (absolute path), None without one
    file: str | None = None
    #: the file was picked up from the working directory, not named by ``--config``
    implicit: bool = False
    #: what the file itself sets: ``RULE.param`` -> value, and its [rules] select / skip / all
    file_thresholds: dict[str, Any] = field(default_factory=dict)
    file_rules: dict[str, Any] = field(default_factory=dict)
    #: what ``--set`` sets: ``RULE.param`` -> value as given
    set_thresholds: dict[str, Any] = field(default_factory=dict)
    #: warnings about the config (code, message, path), carried into the report
    notes: list[tuple[str, str, str]] = field(default_factory=list)

    def add_set(self, text: str) -> None:
        """Parse one ``RULE.param=value``."""
        if "=" not in text or "." not in text.split("=", 1)[0]:
            raise ConfigError(f"--set {text!r}: expected RULE.param=value, e.g. COM001.min_wait_ratio=0.4")
        key, value = text.split("=", 1)
        rule_id, param = key.split(".", 1)
        self.overrides.setdefault(rule_id.strip().upper(), {})[param.strip()] = value.strip()
        self.set_thresholds[f"{rule_id.strip().upper()}.{param.strip()}"] = value.strip()

    def summary(self) -> dict[str, Any]:
        """The report's ``config`` field: the file used (None: none), whether it was picked up from the
        working directory, the thresholds and rule choices it set, and those ``--set`` / ``--rule`` /
        ``--skip`` / ``--all`` set on top."""
        return {
            "file": self.file,
            "implicit": self.implicit,
            "thresholds": _plain(self.file_thresholds),
            "rules": _plain(self.file_rules),
            "set": dict(self.set_thresholds),
            "select": list(self.select),
            "skip": list(self.skip),
            "all_rules": self.all_rules,
        }

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
        try:
            cfg.file = str(path.resolve())
        except OSError:
            cfg.file = str(path)
        rules = data.get("rules", {})
        thresholds = data.get("thresholds", {})
        if not isinstance(rules, dict) or not isinstance(thresholds, dict):
            raise ConfigError(f"{path}: [rules] and [thresholds] must be tables")
        for key in ("select", "skip"):
            if not isinstance(rules.get(key, []), list):
                raise ConfigError(f"{path}: [rules] {key} must be a list of rule ids")
        cfg.select = [str(x).upper() for x in rules.get("select", [])]
        cfg.skip = [str(x).upper() for x in rules.get("skip", [])]
        cfg.all_rules = bool(rules.get("all", False))
        cfg.file_rules = {k: rules[k] for k in ("select", "skip", "all") if k in rules}
        for rid, params in thresholds.items():
            if not isinstance(params, dict):
                raise ConfigError(f"{path}: [thresholds.{rid}] must be a table")
            cfg.overrides.setdefault(rid.upper(), {}).update(params)
            cfg.file_thresholds.update({f"{rid.upper()}.{k}": v for k, v in params.items()})
        return cfg

    def changes(self) -> str:
        """What the config file sets, in a few words (for warnings and the report's config line)."""
        parts = [f"{k}={v}" for k, v in self.file_thresholds.items()]
        if self.file_rules.get("select"):
            parts.append("only " + ", ".join(str(x) for x in self.file_rules["select"]))
        if self.file_rules.get("skip"):
            parts.append("skips " + ", ".join(str(x) for x in self.file_rules["skip"]))
        if self.file_rules.get("all"):
            parts.append("all rules")
        return "; ".join(parts) or "nothing"


def _plain(v: Any) -> Any:
    """``v`` as JSON holds it: TOML's dates and times become their text."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v if v is None or isinstance(v, (str, int, float, bool)) else str(v)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``; did you mean 'X'?`` for the closest of ``choices``, or nothing."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check(cfg: Config, specs: Mapping[str, Any]) -> None:
    """Every rule and threshold that ``cfg`` names exists in ``specs`` (the rule registry) and
    every override has its threshold's type: the same checks the rules' run makes, made before
    a profile is read."""
    for rid in [*cfg.select, *cfg.skip, *cfg.overrides]:
        if rid not in specs:
            raise ConfigError(f"unknown rule {rid!r}{did_you_mean(rid, specs)} (see 'advisor rules')")
    for rid, params in cfg.overrides.items():
        build_thresholds(rid, specs[rid].thresholds, params)


# what DuckDB's memory_limit takes: a number and a unit (1000^i or 1024^i bytes), or a share of the RAM
_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(kb|mb|gb|tb|kib|mib|gib|tib|k|m|g|t|%)\s*$", re.IGNORECASE)


def parse_memory_limit(text: str) -> str:
    """``--memory-limit``: ``8GB``, ``512MB``, ``1.5GiB``, ``4G`` or ``80%`` (of the RAM), as DuckDB reads them.

    Returns the text DuckDB is given (no spaces); anything else is a :class:`ConfigError`."""
    m = _MEMORY_RE.match(text)
    if not m:
        raise ConfigError(f"--memory-limit {text!r}: expected a size such as 8GB, 512MB, 1.5GiB or a share of the RAM "
                          "such as 80%")
    number, unit = float(m.group(1)), m.group(2)
    if number <= 0 or (unit == "%" and number > 100):
        raise ConfigError(f"--memory-limit {text!r}: must be more than 0" + (" and at most 100%" if unit == "%" else ""))
    return f"{m.group(1)}{unit}"


def _coerce(value: Any, default: Any, where: str) -> Any:
    if not isinstance(value, str):
        if isinstance(default, (int, float)) and not isinstance(default, bool) and (
                isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"{where}: {value!r} is not a {type(default).__name__}")
        if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float):
            raise ConfigError(f"{where}: {value!r} is not an int")
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
            raise ConfigError(f"{rule_id}.{name}: no such threshold{did_you_mean(name, fields)} (known: {known})")
        default = fields[name].default
        kwargs[name] = _coerce(value, default, f"{rule_id}.{name}")
    return cls(**kwargs)
