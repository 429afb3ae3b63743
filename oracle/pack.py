"""Pack: a loaded, checked, compiled policy pack, and the embedded ``decide`` entry point."""

from __future__ import annotations

import hashlib
import json
import operator
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from turnout.oracle.compile import compile_pack
from turnout.oracle.compile_types import ArchInfo, PackData
from turnout.oracle.config import DEFAULTS, DeploymentConfig
from turnout.oracle.decision import CanarySnapshot, Decision, Message, Reason
from turnout.oracle.errors import ErrorCode, OracleError
from turnout.oracle.pack_types import Cohort, RuleInfo
from turnout.oracle.paths import POLICIES_DIR, SHIPPED_PACKS
from turnout.oracle.policy import PIN_RULE_IDS, ROLLOUT_RULE_IDS, Evaluator, default_view
from turnout.oracle.steps import SELECT_ERROR_ID, decide_with_steps

MAX_SNAPSHOT_CACHES = 16


class Pack:
    """A compiled policy pack. Build it with :func:`load_pack`; evaluate with :func:`decide`."""

    def __init__(self, data: PackData) -> None:
        self._data = data
        self._eval = Evaluator(data)
        self._views: dict[CanarySnapshot | None, tuple[tuple[Any, ...], str]] = {}
        self._by_state: dict[tuple[Any, ...], tuple[tuple[Any, ...], str]] = {}
        self._caches: dict[CanarySnapshot | None, dict[DeploymentConfig, Decision]] = {}
        # (architecture, runner_kind) -> the refusal text, or None: the manifests are fixed.
        self._unserved_texts: dict[tuple[str, str], str | None] = {}
        self._last: tuple[Any, Any, Any] = (None, None, None)
        # The fields the pack's release lacks, read in one call and compared with their
        # defaults (a config that sets none of them is the common case).
        unknown = data.unknown_fields
        self._unknown_values = operator.attrgetter(*unknown) if unknown else None
        self._unknown_defaults = (
            (DEFAULTS[unknown[0]] if len(unknown) == 1 else tuple(DEFAULTS[n] for n in unknown))
            if unknown
            else None
        )
        self._lock = threading.Lock()
        self._rule_ids = frozenset(
            (
                *(r.id for r in data.rules),
                *(f"step.{s.id}" for s in data.steps),
                *(f"error.{code}" for code in ErrorCode),
                SELECT_ERROR_ID,
                *PIN_RULE_IDS,
                *ROLLOUT_RULE_IDS,
            )
        )

    # -- description -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._data.name

    @property
    def path(self) -> Path:
        return self._data.path

    @property
    def description(self) -> str:
        return self._data.description

    @property
    def digest(self) -> str:
        """Content hash (sha256, 16 hex digits) of the pack's three files."""
        return self._data.digest

    @property
    def env_var(self) -> str:
        """The runner-selection variable (unset: auto, 0: pin V1, 1: pin V2)."""
        return self._data.env_var

    @property
    def cohorts(self) -> tuple[Cohort, ...]:
        """The rollout stages in order, with their default canary state."""
        return tuple(
            Cohort(
                s.id,
                s.label,
                s.enabled,
                s.percentage,
                tuple(sorted(s.families)),
                s.when,
                s.description,
                s.index,
            )
            for s in self._data.stages
        )

    @property
    def rules(self) -> tuple[RuleInfo, ...]:
        return tuple(
            RuleInfo(
                r.id,
                r.label.text,
                r.effect,
                r.severity,
                r.prerequisite,
                {c.dim: c.ops for c in r.conditions},
                r.reason,
                r.reference,
            )
            for r in self._data.rules
        )

    @property
    def rule_ids(self) -> frozenset[str]:
        """Every ``Reason.rule_id`` a decision of this pack can carry: its matrix rules, its
        steps (``step.<id>``), the errors (``error.<code>``, every :class:`ErrorCode`),
        ``select.error``, the pins (``pin.v1``, ``pin.v2``) and the rollout's reasons
        (``rollout.*``). A few hundred ids; the service refuses an event naming another
        (its fallback counts are keyed by rule id, so a made-up id would be a new key)."""
        return self._rule_ids

    @property
    def families(self) -> dict[str, str]:
        """family id -> label."""
        return dict(self._data.family_labels)

    @property
    def architectures(self) -> dict[str, ArchInfo]:
        return dict(self._data.archs)

    @property
    def manifests(self) -> dict[str, Any] | None:
        """runner -> its capability manifest (``pack.manifests``; ``RunnerManifestSpec``), or
        None for a pack without one."""
        return dict(self._data.manifests) if self._data.manifests is not None else None

    @property
    def served_architectures(self) -> dict[str, frozenset[str]] | None:
        """Runner kind -> the architectures some runner serves (None: the pack names no
        manifests, and refuses no architecture for want of a runner)."""
        return dict(self._data.served) if self._data.served is not None else None

    @property
    def domains(self) -> dict[str, tuple[Any, ...] | None]:
        return dict(self._data.domains)

    @property
    def kill_switch(self) -> bool:
        """The kill switch's default (rollout.yaml)."""
        return self._data.kill_switch

    @property
    def compiled_source(self) -> str:
        """The generated Python of ``match`` and ``cohort`` (for inspection)."""
        return self._data.source

    @property
    def data(self) -> PackData:
        return self._data

    def pin_env(self, runner: str | None) -> dict[str, str]:
        """The environment that pins ``runner`` ("v1" / "v2") with this pack (None: auto)."""
        return {} if runner is None else {self.env_var: "1" if runner == "v2" else "0"}

    def __repr__(self) -> str:
        return f"Pack({self.name!r}, digest={self.digest!r})"

    # -- evaluation --------------------------------------------------------------------------

    def _view(self, canaries: CanarySnapshot | None) -> tuple[tuple[Any, ...], str]:
        got = self._views.get(canaries)
        if got is not None:
            return got
        stages = self._data.stages
        if canaries is None:
            view = default_view(stages, self._data.kill_switch)
        else:
            states = canaries.cohorts
            view = (
                canaries.kill_switch,
                *(
                    (states[s.id].enabled, states[s.id].percentage)
                    if s.id in states
                    else (s.enabled, s.percentage)
                    for s in stages
                ),
            )
        with self._lock:
            # The digest describes the effective state (kill switch, then each stage's enabled
            # and percentage), not the snapshot's spelling: cohorts left out or unknown to the
            # pack, or a snapshot equal to the defaults, give the digest of the same state.
            # Equal states share one (view, digest) pair, so the evaluator's memo keeps hitting.
            got = self._by_state.get(view)
            if got is None:
                per_stage = [[s.id, *st] for s, st in zip(stages, view[1:], strict=True)]
                body = json.dumps([view[0], per_stage])
                digest = hashlib.sha256(f"{self.digest}:{body}".encode()).hexdigest()[:16]
                got = self._by_state.setdefault(view, (view, digest))
            self._views.setdefault(canaries, got)
        return self._views[canaries]

    def _cache(self, canaries: CanarySnapshot | None) -> dict[DeploymentConfig, Decision]:
        """The decision cache of a snapshot. Hypothetical snapshots (the service's impact
        preview makes one per cohort x percentage asked) must not pile up caches: the most
        recent MAX_SNAPSHOT_CACHES are kept, an evicted one is rebuilt on its next use."""
        self._view(canaries)
        with self._lock:
            cache = self._caches.setdefault(canaries, {})
            while len(self._caches) > MAX_SNAPSHOT_CACHES:
                del self._caches[next(iter(self._caches))]
        return cache

    def policy_digest(self, canaries: CanarySnapshot | None = None) -> str:
        """Content hash of this pack together with the canary snapshot (None: the defaults)."""
        return self._view(canaries)[1]

    def decide(self, config: DeploymentConfig, canaries: CanarySnapshot | None = None) -> Decision:
        """See :func:`oracle.decide`."""
        last = self._last
        if last[0] is config and last[1] is canaries:
            return last[2]  # type: ignore[no-any-return]
        cache = self._caches.get(canaries)
        if cache is None:
            cache = self._cache(canaries)
        d = cache.get(config)
        if d is None:
            d = self._decide_uncached(config, canaries)
            if len(cache) >= 100_000:
                cache.clear()
            cache[config] = d
        self._last = (config, canaries, d)
        return d

    def decide_rollout(
        self, config: DeploymentConfig, canaries: CanarySnapshot | None = None
    ) -> Decision:
        """The rollout's answer alone (docs/architecture.md §3.3 step 5: kill switch, the
        config's stage, its canary and sticky share), none of the pack's rules evaluated: for a
        deployment whose capabilities another pack judges (``turnout launch``). An architecture
        the pack does not know gives the unknown-architecture error (runner "v1", reason code
        ERROR)."""
        view, digest = self._view(canaries)
        found = self._data.archs.get(config.architecture) if config.family is None else None  # type: ignore[arg-type]
        a = found if found is not None else self._arch(config)
        if isinstance(a, str):
            return self._error(config, "v1", "auto", a, ErrorCode.UNKNOWN_ARCHITECTURE, digest)
        return self._eval.rollout_only(config, a, view, digest)

    def decide_attributes(self, c: Any, canaries: CanarySnapshot | None = None) -> Decision:
        """Decide for any object with DeploymentConfig's attributes, already checked (the
        matrix's cells); uncached per config. Prefer :meth:`decide`."""
        self._view(canaries)
        return self._decide_uncached(c, canaries)

    def steps_applied(self, c: DeploymentConfig) -> list[str]:
        """The ids of the pack's steps that apply to ``c``, in order (for coverage checks)."""
        applied: set[int] = set()
        self._view(None)
        self._decide_uncached(c, None, applied)
        return [s.id for s in self._data.steps if s.index in applied]

    def _decide_uncached(
        self, c: DeploymentConfig, canaries: CanarySnapshot | None, applied: set[int] | None = None
    ) -> Decision:
        view, digest = self._views[canaries]
        data = self._data
        found = data.archs.get(c.architecture) if c.family is None else None  # type: ignore[arg-type]
        a = found if found is not None else self._arch(c)
        if isinstance(a, str):
            mode = "auto" if data.env_var not in c.env else "pinned"
            return self._error(c, "v1", mode, a, ErrorCode.UNKNOWN_ARCHITECTURE, digest)
        if self._unknown_values is not None and self._unknown_values(c) != self._unknown_defaults:
            unknown = self._unknown_setting(c)
            if unknown is not None:
                return self._error(
                    c, None, "auto", unknown, ErrorCode.UNKNOWN_SETTING, digest, a.family
                )
        raw = c.env.get(data.env_var)
        pin: str | None = "auto"
        pin_error: Decision | None = None
        if raw is not None:
            try:
                pin = self._pin(raw)
            except OracleError as exc:
                pin_error = self._error(
                    c, None, "pinned", exc.message, ErrorCode.INVALID_ENV, digest, a.family
                )
                pin = None
        if pin_error is not None and not data.steps:
            return pin_error
        if data.served is not None and c.architecture is not None:
            unserved = self._unserved(c.architecture, c.runner_kind or a.runner_kind)
            if unserved is not None:
                mode = "auto" if raw is None else "pinned"
                return self._error(
                    c,
                    None,
                    mode,
                    unserved,
                    ErrorCode.ARCHITECTURE_NOT_SERVED,
                    digest,
                    a.family,
                    {"architecture": c.architecture, "runner_kind": c.runner_kind or a.runner_kind},
                )
        if data.steps:
            d = decide_with_steps(
                data,
                self._eval,
                c,
                a,
                pin,
                pin_error,
                view,
                digest,
                applied,
            )
        else:
            assert pin is not None
            d = self._eval.resolve(c, a, pin, view, digest)
        if len(c.env) > (raw is not None):
            d = d._replace(messages=(*d.messages, *self._foreign_env(c)))
        return d

    def refusal(self, c: DeploymentConfig, text: str, code: ErrorCode) -> Decision:
        """A Decision that starts no runner for ``c`` because of input this pack's release
        cannot read (``code``/``text``: the ConfigError, e.g. a flag its ``vllm serve``
        parser refuses), as upgrade previews report a line the other release still reads."""
        _, digest = self._view(None)
        found = self._data.archs.get(c.architecture) if c.architecture is not None else None
        return self._error(
            c, None, "auto", text, code, digest, found.family if found is not None else c.family
        )

    def _unknown_setting(self, c: DeploymentConfig) -> str | None:
        """The error for a config that sets a field the pack's release does not have."""
        names = [n for n in self._data.unknown_fields if getattr(c, n) != DEFAULTS[n]]
        if not names:
            return None
        release = self._data.release or self.name
        return (
            f"{', '.join(names)}: not a setting of vLLM {release} (the {self.name} pack); "
            "a later release has it"
        )

    def _foreign_env(self, c: DeploymentConfig) -> tuple[Message, ...]:
        """A warning per runner variable this pack does not read (``VLLM_USE_V2_MODEL_RUNNER=0``
        under the turnout pack pins nothing: say so rather than ignore it silently)."""
        own = self._data.env_var
        return tuple(
            Message(
                "WARNING",
                f"{name} is not read by the {self.name} pack (its "
                f"runner variable is {own}); ignoring {name}={value!r}.",
            )
            for name, value in sorted(c.env.items())
            if name != own
        )

    def _arch(self, c: DeploymentConfig) -> ArchInfo | str:
        """The ArchInfo of the config, or the error message when there is none."""
        d = self._data
        if c.family is not None:
            fam = d.family_defaults.get(c.family)
            if fam is None:
                return (
                    f"unknown family {c.family!r}: not in the {d.name} pack's families.yaml "
                    f"({len(d.family_defaults)} families)"
                )
            return fam
        if c.architecture is None:
            return (
                "no architecture given: pass --architecture ARCH or --config "
                "path/to/config.json (or the model's family)"
            )
        arch = d.archs.get(c.architecture)
        if arch is None:
            return (
                f"unknown architecture {c.architecture!r}: not in the {d.name} pack's "
                "families.yaml; pass a known --architecture, or a family override"
            )
        return arch

    def _unserved(self, architecture: str, runner_kind: str) -> str | None:
        """The refusal of an architecture no runner's manifest serves for ``runner_kind``
        (``pack.manifests``), or None when one does (memoised per pair)."""
        key = (architecture, runner_kind)
        if key not in self._unserved_texts:
            self._unserved_texts[key] = self._unserved_text(architecture, runner_kind)
        return self._unserved_texts[key]

    def _unserved_text(self, architecture: str, runner_kind: str) -> str | None:
        served = self._data.served or {}
        if architecture in served.get(runner_kind, ()):
            return None
        other = [k for k, archs in sorted(served.items()) if architecture in archs]
        if other:
            listed = ", ".join(sorted(served.get(runner_kind, ()))) or "none"
            return (
                f"no runner of this build serves architecture {architecture!r} for "
                f"{runner_kind} (only for {', '.join(other)}); supported for {runner_kind}: "
                f"{listed}"
            )
        listed = (
            "; ".join(
                f"{', '.join(sorted(archs))} ({kind})"
                for kind, archs in sorted(served.items())
                if archs
            )
            or "none"
        )
        return f"no runner of this build serves architecture {architecture!r}; supported: {listed}"

    def _pin(self, raw: str | None) -> str:
        if raw is None:
            return "auto"
        if self._data.env_parse == "int":
            try:
                return "v2" if int(raw) else "v1"  # vLLM envs.py: bool(int(value))
            except ValueError as exc:
                raise OracleError(str(exc), code=ErrorCode.INVALID_ENV) from None
        value = raw.strip()
        if value in ("0", "1"):
            return "v2" if value == "1" else "v1"
        tpl = self._data.messages["invalid_env"]
        text = tpl.render({"name": self._data.env_var, "value": raw}) if tpl else raw
        raise OracleError(text, code=ErrorCode.INVALID_ENV)

    def _error(
        self,
        c: DeploymentConfig,
        runner: str | None,
        mode: str,
        text: str,
        code: ErrorCode,
        digest: str,
        family: str | None = None,
        matched: Mapping[str, Any] | None = None,
    ) -> Decision:
        if matched is None:
            matched = (
                {"architecture": c.architecture}
                if code == ErrorCode.UNKNOWN_ARCHITECTURE
                else {self._data.env_var: c.env.get(self._data.env_var)}
            )
        ref = (self._data.manifests_file or "") if code == ErrorCode.ARCHITECTURE_NOT_SERVED else ""
        reason = Reason(f"error.{code}", text, "hard", "error", matched, ref)
        messages: tuple[Message, ...] = ()
        if runner == "v1":
            messages = (Message("WARNING", f"{text}; using the V1 model runner instead."),)
        return Decision(
            runner,  # type: ignore[arg-type]
            mode,  # type: ignore[arg-type]
            family,
            None,
            None,
            (reason,),
            messages,
            "ERROR",
            text,
            digest,
            code,
            self.name,
        )


_PACKS: dict[str, Pack] = {}
_PACKS_LOCK = threading.Lock()


def resolve_pack_dir(name_or_path: str | Path) -> Path:
    """The folder of a shipped pack name or a path; OracleError when neither exists."""
    text = str(name_or_path)
    if isinstance(name_or_path, str) and text in SHIPPED_PACKS:
        return POLICIES_DIR / text
    path = Path(name_or_path)
    if path.is_dir():
        return path.resolve()
    raise OracleError(
        f"no policy pack {text!r}: expected one of {', '.join(SHIPPED_PACKS)} or "
        "a folder holding capability_matrix.yaml, families.yaml and rollout.yaml",
        code=ErrorCode.UNKNOWN_PACK,
    )


def load_pack(name_or_path: str | Path = "turnout") -> Pack:
    """Load, validate and compile a policy pack once (cached by its folder).

    ``name_or_path`` is a shipped pack name ("turnout", "vllm-0.31") or a folder. Raises
    :class:`~oracle.errors.PackError` whose message names file:line:column of every problem,
    or :class:`~oracle.errors.OracleError` (code ``unknown_pack``) for a missing pack.
    """
    folder = resolve_pack_dir(name_or_path)
    key = str(folder)
    pack = _PACKS.get(key)
    if pack is None:
        with _PACKS_LOCK:
            pack = _PACKS.get(key)
            if pack is None:
                pack = Pack(compile_pack(folder))
                _PACKS[key] = pack
    return pack


def decide(
    config: DeploymentConfig, *, pack: Pack, canaries: CanarySnapshot | None = None
) -> Decision:
    """The runner for ``config`` under ``pack`` and the canary snapshot (None: pack defaults).

    Pure and thread-safe, no I/O; cached per (config, snapshot). Never raises for bad
    deployment facts: an unknown architecture gives runner "v1" with reason code ERROR, an
    invalid runner variable, a pin that cannot be honoured and (in a pack with
    ``pack.manifests``) an architecture no runner serves give runner None with ``error``.
    """
    return pack.decide(config, canaries)
