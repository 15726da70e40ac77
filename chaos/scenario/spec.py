"""Fault specs: `KIND:key=value,key=value`, built as a `Spec`, parsed into `FaultSpec`.

A `Spec` is the value every planner builds (the battery, the crash points and states,
the suites, the incident mapping): a kind and its pairs in the order given. Its text
is made in one place, `str(spec)`, where it is shown, written or parsed;
`Spec.read` takes a text back into pairs, and `parse_fault_spec` checks it against its
kind. Nothing else takes a spec's text apart.

A spec has three parts, told apart by key:
- target: `rank=` or `node=` (an index, or `one` for a seeded random pick);
- trigger: `step=N`, `phase=checkpoint_save|checkpoint_load` with `event=N`
  (and `save=K`), `time=SECONDS`, or `p=PROB` (per step, seeded);
- everything else is a parameter of the kind (e.g. `signal=SIGTERM`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from torchchaos.errors import UsageError, did_you_mean
from torchchaos.faults.contract import Trigger
from torchchaos.faults.registry import get_kind

PHASES = ("checkpoint_save", "checkpoint_load")
TARGET_KEYS = ("rank", "node")
TRIGGER_KEYS = ("step", "phase", "save", "event", "time", "p")
SYMBOLIC_TARGETS = ("one",)


Pairs = tuple[tuple[str, str], ...]  # a spec's key=value pairs, or a part of them


def pairs(**given: object) -> Pairs:
    """Key=value pairs in the order given, values as text; a None value is left out
    (`for=` is a Python keyword: pass it as `**{"for": ...}`)."""
    return tuple((key, str(value)) for key, value in given.items() if value is not None)


@dataclass(frozen=True)
class Spec:
    """A fault spec as a value (see the module's docstring)."""

    kind: str
    pairs: Pairs = ()

    @classmethod
    def make(cls, kind: str, *parts: Iterable[tuple[str, str]], **given: object) -> Spec:
        """`kind` with `parts` (pairs made before: a trigger, a target) and then `given`,
        in that order."""
        return cls(kind, ()).plus(*parts, **given)

    def plus(self, *parts: Iterable[tuple[str, str]], **given: object) -> Spec:
        """These pairs after the ones it has."""
        more = tuple(pair for part in parts for pair in part) + pairs(**given)
        return Spec(self.kind, self.pairs + more)

    def get(self, key: str) -> str | None:
        return next((value for k, value in self.pairs if k == key), None)

    def trigger(self) -> Pairs:
        """Its trigger's pairs (`step=`, or `phase=` with `save=` and `event=`, ...)."""
        return tuple((k, v) for k, v in self.pairs if k in TRIGGER_KEYS)

    def parse(self) -> FaultSpec:
        return parse_fault_spec(str(self))

    @classmethod
    def read(cls, text: str) -> Spec:
        """A spec's text back into pairs, in its order; checks only its shape
        (`parse_fault_spec` checks it against its kind)."""
        kind, sep, body = text.partition(":")
        found = _split_pairs(text, body) if sep and body.strip() else {}
        return cls(kind.strip(), tuple(found.items()))

    def __str__(self) -> str:
        body = ",".join(f"{key}={value}" for key, value in self.pairs)
        return f"{self.kind}:{body}" if body else self.kind


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    target_type: str  # "rank" or "node"
    target: str  # an index as text, or a symbolic target
    trigger: Trigger
    params: dict[str, object] = field(default_factory=dict)
    text: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            self.target_type: self.target,
            "trigger": self.trigger.describe(),
            "params": dict(self.params),
            "spec": self.text,
        }


def _int(key: str, value: str, minimum: int = 0) -> int:
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"{key}= needs an integer, got {value!r}") from None
    if number < minimum:
        raise UsageError(f"{key}= must be >= {minimum}, got {number}")
    return number


def _float(key: str, value: str, low: float, high: float | None = None) -> float:
    try:
        number = float(value)
    except ValueError:
        raise UsageError(f"{key}= needs a number, got {value!r}") from None
    if number < low or (high is not None and number > high) or number != number:
        upper = f" and <= {high:g}" if high is not None else ""
        raise UsageError(f"{key}= must be >= {low:g}{upper}, got {value}")
    return number


def _split_pairs(text: str, body: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in body.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise UsageError(f"malformed fault spec {text!r}: expected key=value, got {item!r}")
        if key in pairs:
            raise UsageError(f"malformed fault spec {text!r}: {key}= given twice")
        pairs[key] = value
    return pairs


def _parse_trigger(text: str, pairs: dict[str, str]) -> Trigger:
    given = [k for k in ("step", "phase", "time", "p") if k in pairs]
    if len(given) != 1:
        raise UsageError(
            f"fault spec {text!r} needs exactly one trigger (step=, phase=, time= or p=),"
            f" got {len(given)}"
        )
    if "step" in pairs:
        return Trigger(step=_int("step", pairs.pop("step"), minimum=1))
    if "time" in pairs:
        return Trigger(time=_float("time", pairs.pop("time"), 0.0))
    if "p" in pairs:
        return Trigger(p=_float("p", pairs.pop("p"), 0.0, 1.0))
    phase = pairs.pop("phase")
    if phase not in PHASES:
        raise UsageError(f"unknown phase {phase!r} in {text!r} (known: {', '.join(PHASES)})")
    event = _int("event", pairs.pop("event", "1"), minimum=1)
    save = _int("save", pairs.pop("save", "1"), minimum=1)
    return Trigger(phase=phase, event=event, save=save)


def _parse_target(text: str, pairs: dict[str, str],
                  kinds: tuple[str, ...]) -> tuple[str, str]:
    given = [k for k in ("rank", "node") if k in pairs]
    if len(given) > 1:
        raise UsageError(f"fault spec {text!r} names both rank= and node=")
    if not given:
        return kinds[0], "one"
    key = given[0]
    value = pairs.pop(key)
    if value not in SYMBOLIC_TARGETS:
        _int(key, value)
    return key, value


def _refuse_unknown_keys(kind_name: str, own: list[str], pairs: dict[str, str]) -> None:
    """Every key a kind takes, said at once, with the close one for a typo: a key left out
    of the list reads as one the kind refuses."""
    known = [*TARGET_KEYS, *TRIGGER_KEYS, *own]
    for key in pairs:
        if key not in known:
            raise UsageError(
                f"fault {kind_name!r} has no key {key!r}{did_you_mean(key, known)}; it takes"
                f" rank= or node= (the target), step=, phase= (with save=, event=), time= or"
                f" p= (the trigger)"
                + (f", and its own {', '.join(k + '=' for k in own)}" if own else ""))


def parse_fault_spec(text: str) -> FaultSpec:
    """Parse `KIND:key=value,...`; raises UsageError with a one-line reason."""
    kind_name, sep, body = text.partition(":")
    kind_name = kind_name.strip()
    if not kind_name:
        raise UsageError(f"malformed fault spec {text!r}: expected KIND:key=value,...")
    kind = get_kind(kind_name)
    pairs = _split_pairs(text, body) if sep and body.strip() else {}
    _refuse_unknown_keys(kind_name, sorted(kind.params), pairs)
    target_type, target = _parse_target(text, pairs, kind.targets)
    if target_type not in kind.targets:
        raise UsageError(f"fault {kind_name!r} hits a {' or '.join(kind.targets)}, not a"
                         f" {target_type} ({text!r})")
    trigger = _parse_trigger(text, pairs)
    params: dict[str, object] = {}
    for key, value in pairs.items():
        parser = kind.params[key]
        try:
            params[key] = parser(value)
        except ValueError as exc:
            raise UsageError(f"bad value for {kind_name} {key}=: {exc}") from None
    kind.validate(params)
    return FaultSpec(kind_name, target_type, target, trigger, params, text)
