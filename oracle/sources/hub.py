"""A model's ``config.json`` found the way vLLM finds it, through ``huggingface_hub``.

Order (:func:`resolve_model_config`): a local directory holding a config.json (or a .json
file); the local HF cache (``try_to_load_from_cache``); the hub when online (``hf_hub_download``
of config.json at ``--revision``); then ``policies/known_models.yaml``, for offline use. Each
step that finds nothing leaves a note saying why (in :attr:`ModelConfigSource.notes`, and in
the error when no step finds the model).

The environment of the process running the oracle is read on every call, as huggingface_hub
reads it: ``HF_ENDPOINT`` (default https://huggingface.co), ``HF_TOKEN``, ``HF_HUB_OFFLINE=1``
(or ``TRANSFORMERS_OFFLINE=1``: never touch the network), ``HF_HUB_CACHE`` / ``HF_HOME``,
``HF_HUB_ETAG_TIMEOUT`` (seconds; default 3 here). The ``NAME=value`` prefix of a command line
describes the serving machine and is not used: a request to the service cannot point the
oracle at another host. A hub that cannot be reached is not asked again for
:data:`UNREACHABLE_TTL_S` seconds; a definite refusal (no such model, gated) is kept for
:data:`REFUSAL_TTL_S` seconds (:func:`forget_hub_failures` clears both).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from turnout.oracle.errors import ConfigError, ErrorCode
from turnout.oracle.schema import KnownModel
from turnout.oracle.sources.hf_config import hf_config_to_fields, read_hf_config
from turnout.oracle.sources.known_models import candidate_architectures, lookup_model

CONFIG_NAME = "config.json"
DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_TIMEOUT_S = 3.0
UNREACHABLE_TTL_S = 60.0
REFUSAL_TTL_S = 300.0
_MAX_REFUSALS = 1024
_TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's ENV_VARS_TRUE_VALUES
# The HTTP clients of huggingface_hub's releases (0.x requests, 1.x httpx, 2.x httpx2).
_HTTP_CLIENTS = {"httpx", "httpx2", "httpcore", "httpcore2", "requests", "urllib3"}
DEFAULT_HINT = "pass architecture=ARCH or hf_config=path/to/config.json"
Source = Literal["local", "hf_cache", "hub", "known_models"]
SOURCE_TEXT: dict[str, str] = {
    "local": "a local directory",
    "hf_cache": "the HF cache",
    "hub": "the hub",
    "known_models": "policies/known_models.yaml",
}
Refusal = Literal["gated", "not_found", "no_config", "unreachable", "error"]


@dataclass(frozen=True)
class HubSettings:
    """What huggingface_hub is asked with, read from an environment mapping."""

    endpoint: str
    cache_dir: str
    token: str | None  # None: huggingface_hub's own (the token file of `hf auth login`)
    offline: str | None  # why the network is off (``HF_HUB_OFFLINE=1``), None when online
    timeout_s: float

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, offline: bool = False) -> HubSettings:
        """Raises ConfigError (``bad_value``) for a ``HF_HUB_ETAG_TIMEOUT`` that is not a
        positive number of seconds."""
        why = "offline=True" if offline else None
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            if why is None and env.get(name, "").strip().upper() in _TRUE:
                why = f"{name}={env[name]}"
        home = env.get("HF_HOME") or os.path.join(
            env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface"
        )
        cache = (
            env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
        )
        token = env.get("HF_TOKEN") or env.get("HUGGING_FACE_HUB_TOKEN") or None
        endpoint = (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        return cls(
            endpoint,
            os.path.expanduser(os.path.expandvars(cache)),
            token,
            why,
            _timeout(env.get("HF_HUB_ETAG_TIMEOUT")),
        )


def _timeout(raw: str | None) -> float:
    if raw is None or not raw.strip():
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(
            f"HF_HUB_ETAG_TIMEOUT: expected a positive number of seconds, got {raw!r}",
            code=ErrorCode.BAD_VALUE,
            field="HF_HUB_ETAG_TIMEOUT",
        )
    return value


@dataclass(frozen=True)
class ModelConfigSource:
    """Where a model's facts came from: ``source`` is ``local``, ``hf_cache``, ``hub`` (with
    the parsed ``config`` and the ``path`` read) or ``known_models`` (with ``known``).

    ``revision`` is the one asked for (None: the default branch); ``commit`` the commit the
    HF cache or the hub resolved it to; ``notes`` say why each earlier step found nothing.
    """

    model: str
    source: Source
    config: Mapping[str, Any] | None = None
    path: str | None = None
    revision: str | None = None
    commit: str | None = None
    known: KnownModel | None = None
    notes: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        """DeploymentConfig keyword arguments: :func:`hf_config_to_fields` of the config, or
        the known_models.yaml entry (architecture, attributes, a stated quantization)."""
        if self.config is not None:
            return hf_config_to_fields(self.config)
        assert self.known is not None
        out: dict[str, Any] = {"architecture": self.known.architecture, **self.known.attributes}
        if self.known.quantization != "none":
            out["quantization"] = self.known.quantization
        return out

    def describe(self) -> str:
        """One line for people: where the facts came from, and why not from earlier steps."""
        at = f" at revision {self.revision}" if self.revision else ""
        commit = f" (commit {self.commit[:12]})" if self.commit else ""
        where = f": {self.path}" if self.path else ""
        why = f" ({'; '.join(self.notes)})" if self.notes and self.known else ""
        return f"{self.model}{at} from {SOURCE_TEXT[self.source]}{commit}{where}{why}"


def resolve_model_config(
    model_id: str,
    revision: str | None = None,
    *,
    base_dir: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    offline: bool = False,
    hint: str = DEFAULT_HINT,
    what: str = "model",
    local_files: bool = True,
) -> ModelConfigSource:
    """The config.json of ``model_id`` (a local path or a hub repo id) at ``revision``, or its
    known_models.yaml entry, with where it came from (see the module docstring for the order).

    ``env`` defaults to ``os.environ``; ``offline`` forces ``HF_HUB_OFFLINE=1``; ``base_dir``
    anchors a relative local path; ``hint`` says how to give the architecture instead, and
    ``what`` names the input in errors (``model``, ``--hf-config-path``); ``local_files=False``
    (the service: a request must not name the server's files) never reads a local path, and a
    model id that is a path is refused as ``local_file``. Raises ConfigError:
    ``unknown_model`` (found nowhere: the message lists each step's answer and the
    architectures the name suggests), ``gated_model`` (the hub refuses it without access and
    known_models.yaml lacks it), ``revision_not_found`` (the hub has the model, not that
    revision), ``bad_spec`` (a config.json that is not a JSON object).
    """
    notes: list[str] = []
    if not local_files and _is_path_like(model_id):
        raise ConfigError(
            f"{what} {model_id!r} is a local path: the service reads no file a "
            "request names; give a hub repo id (org/name) or a config",
            code=ErrorCode.LOCAL_FILE,
            field=what,
        )
    local = _local_config(model_id, base_dir) if local_files else None
    if local is not None:
        return ModelConfigSource(model_id, "local", read_hf_config(local), str(local), revision)
    refusal: Refusal | None = None
    if _looks_like_path(model_id, base_dir):
        notes.append("not a local directory with a config.json")
    else:
        notes.append("not a local directory")
        settings = HubSettings.from_env(os.environ if env is None else env, offline=offline)
        found, refusal = _from_hf(model_id, revision, settings, notes, what)
        if found is not None:
            return found
    known = lookup_model(model_id)
    if known is not None:
        return ModelConfigSource(
            model_id, "known_models", revision=revision, known=known, notes=tuple(notes)
        )
    raise _unresolved(model_id, notes, refusal, hint, what)


def forget_hub_failures() -> None:
    """Forget unreachable hubs and refused models (a long-lived process after a fix)."""
    with _LOCK:
        _UNREACHABLE.clear()
        _REFUSED.clear()


def _local_config(model_id: str, base_dir: str | Path | None) -> Path | None:
    p = _path(model_id, base_dir)
    if p is None:
        return None
    try:
        if (p / CONFIG_NAME).is_file():
            return p / CONFIG_NAME
        return p if p.suffix == ".json" and p.is_file() else None
    except OSError:  # a name too long for the file system, a loop: not a local file
        return None


def _path(model_id: str, base_dir: str | Path | None) -> Path | None:
    """``model_id`` as a local path, or None when it cannot be one (``~nosuchuser``)."""
    try:
        p = Path(model_id).expanduser()
    except RuntimeError:  # an unknown user's home
        return None
    return Path(base_dir) / p if base_dir is not None and not p.is_absolute() else p


def _is_path_like(model_id: str) -> bool:
    """Spelled as a path (absolute, ./ ../ ~, more than one '/', a .json file), not ``org/name``."""
    return (
        model_id.startswith(("/", "./", "../", "~"))
        or model_id.count("/") > 1
        or model_id.endswith(".json")
    )


def _looks_like_path(model_id: str, base_dir: str | Path | None) -> bool:
    """A path, never a hub repo id: absolute, ./ ../ ~, more than one '/', or an existing
    directory (repo ids are ``name`` or ``org/name``)."""
    if _is_path_like(model_id) and not model_id.endswith(".json"):
        return True
    p = _path(model_id, base_dir)
    try:
        return p is not None and p.is_dir()
    except OSError:
        return False


# -- the HF cache and the hub ----------------------------------------------------------------

_LOCK = threading.Lock()
_UNREACHABLE: dict[str, tuple[float, str]] = {}  # endpoint -> (until, what went wrong)
_REFUSED: dict[tuple[str, str, str | None, str | None], tuple[float, Refusal, str]] = {}


def _import_hub() -> ModuleType | None:
    try:
        import huggingface_hub
        import huggingface_hub.errors
        import huggingface_hub.utils
    except ImportError:
        return None
    return huggingface_hub


def _from_hf(
    repo_id: str, revision: str | None, settings: HubSettings, notes: list[str], what: str
) -> tuple[ModelConfigSource | None, Refusal | None]:
    hub = _import_hub()
    if hub is None:
        notes.append("the HF cache and the hub were not read: huggingface_hub is not installed")
        return None, None
    try:
        hub.utils.validate_repo_id(repo_id)
    except hub.errors.HFValidationError:
        notes.append(f"{repo_id!r} is not a hub repo id (org/name)")
        return None, None
    at = revision or "main"
    cached = hub.try_to_load_from_cache(
        repo_id, CONFIG_NAME, cache_dir=settings.cache_dir, revision=at
    )
    if isinstance(cached, str):
        return ModelConfigSource(
            repo_id,
            "hf_cache",
            read_hf_config(cached),
            cached,
            revision,
            Path(cached).parent.name,
            notes=tuple(notes),
        ), None
    notes.append(f"not in the HF cache {settings.cache_dir} at revision {at}")
    if settings.offline:
        notes.append(f"the hub was not asked ({settings.offline})")
        return None, None
    skipped = _remembered(repo_id, revision, settings)
    if skipped is not None:
        notes.append(skipped[1])
        return None, skipped[0]
    try:
        path, commit = _download(hub, repo_id, revision, settings)
    except Exception as exc:  # huggingface_hub raises its own errors and its HTTP client's
        kind, text = _classify(hub, exc, repo_id, revision, settings, what)
        _remember(kind, text, repo_id, revision, settings)
        notes.append(text)
        return None, kind
    return ModelConfigSource(
        repo_id, "hub", read_hf_config(path), path, revision, commit, notes=tuple(notes)
    ), None


def _download(
    hub: ModuleType, repo_id: str, revision: str | None, settings: HubSettings
) -> tuple[str, str | None]:
    """(cached path, commit). A HEAD first, without retries and with the short timeout:
    hf_hub_download alone retries a hub that is down for tens of seconds."""
    url = hub.hf_hub_url(repo_id, CONFIG_NAME, revision=revision, endpoint=settings.endpoint)
    meta = hub.get_hf_file_metadata(
        url,
        token=settings.token,
        timeout=settings.timeout_s,
        library_name="turnout",
        endpoint=settings.endpoint,
    )
    path = hub.hf_hub_download(
        repo_id,
        CONFIG_NAME,
        revision=revision,
        cache_dir=settings.cache_dir,
        token=settings.token,
        endpoint=settings.endpoint,
        etag_timeout=settings.timeout_s,
        library_name="turnout",
        tqdm_class=_silent_tqdm(hub),
    )
    return str(path), meta.commit_hash


def _silent_tqdm(hub: ModuleType) -> type:
    """huggingface_hub's progress bar class, switched off (the CLI's stderr stays readable)."""
    base: type = hub.utils.tqdm

    class Silent(base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Silent


def _classify(
    hub: ModuleType,
    exc: Exception,
    repo_id: str,
    revision: str | None,
    settings: HubSettings,
    what: str,
) -> tuple[Refusal, str]:
    """What a failed hub lookup means; raises ConfigError for a revision that does not exist."""
    errors, where = hub.errors, f"the hub {settings.endpoint}"
    at = revision or "main"
    if isinstance(exc, errors.RevisionNotFoundError):
        raise ConfigError(
            f"{what} {repo_id!r}: {where} has no revision {at!r} of it; pass "
            "--revision with one of its branches, tags or commits",
            code=ErrorCode.REVISION_NOT_FOUND,
            field="revision",
        ) from None
    if isinstance(exc, errors.GatedRepoError):
        token = "HF_TOKEN gives no access to it" if settings.token else "HF_TOKEN is not set"
        return "gated", (
            f"{where} refuses it: a gated model, and {token} (ask for access on "
            "the model's page, then set HF_TOKEN)"
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return "not_found", f"{where} has no such model (or it is private to other tokens)"
    if isinstance(exc, errors.LocalEntryNotFoundError):  # hf_hub_download lost the hub
        cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
        return "unreachable", f"{where} could not be reached ({_first_line(cause)})"
    if isinstance(exc, errors.EntryNotFoundError):
        return "no_config", f"{where} has the model but no {CONFIG_NAME} at revision {at}"
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return "unreachable", f"the hub was not asked ({exc})"
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if (
        isinstance(exc, errors.HfHubHTTPError)
        and isinstance(status, int)
        and status < 500
        and status != 429
    ):
        return "error", f"{where} answered HTTP {status} ({_first_line(exc)})"
    if status is not None:
        return "unreachable", f"{where} is unavailable (HTTP {status}: {_first_line(exc)})"
    if (
        isinstance(exc, ConnectionError | TimeoutError)
        or type(exc).__module__.partition(".")[0] in _HTTP_CLIENTS
    ):
        return (
            "unreachable",
            f"{where} could not be reached ({type(exc).__name__}: {_first_line(exc)})",
        )
    return (
        "error",
        f"reading config.json from {where} failed ({type(exc).__name__}: {_first_line(exc)})",
    )  # a full or read-only cache, ...: not the network


def _first_line(exc: Exception) -> str:
    text = getattr(exc, "server_message", None) or str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


def _key(
    repo_id: str, revision: str | None, s: HubSettings
) -> tuple[str, str, str | None, str | None]:
    token = hashlib.sha256(s.token.encode()).hexdigest() if s.token else None  # not kept as is
    return (s.endpoint, repo_id, revision, token)


def _remembered(repo_id: str, revision: str | None, s: HubSettings) -> tuple[Refusal, str] | None:
    now = time.monotonic()
    with _LOCK:
        down = _UNREACHABLE.get(s.endpoint)
        if down is not None and down[0] > now:
            return "unreachable", f"{down[1]}; not asked again for {UNREACHABLE_TTL_S:.0f} s"
        refused = _REFUSED.get(_key(repo_id, revision, s))
        if refused is not None and refused[0] > now:
            return refused[1], refused[2]
    return None


def _remember(kind: Refusal, text: str, repo_id: str, revision: str | None, s: HubSettings) -> None:
    now = time.monotonic()
    with _LOCK:
        if kind == "unreachable":
            _UNREACHABLE[s.endpoint] = (now + UNREACHABLE_TTL_S, text)
        elif kind in ("gated", "not_found", "no_config"):
            if len(_REFUSED) >= _MAX_REFUSALS:
                _REFUSED.clear()
            _REFUSED[_key(repo_id, revision, s)] = (now + REFUSAL_TTL_S, kind, text)


# -- the error when nothing knows the model --------------------------------------------------


def _unresolved(
    model_id: str, notes: list[str], refusal: Refusal | None, hint: str, what: str
) -> ConfigError:
    trail = "; ".join(notes)
    field = "model" if what == "model" else what.lstrip("-").replace("-", "_")
    if refusal == "gated":
        return ConfigError(
            f"{what} {model_id!r} is gated and not in "
            f"policies/known_models.yaml ({trail}); or {hint}",
            code=ErrorCode.GATED_MODEL,
            field=field,
        )
    candidates = candidate_architectures(model_id)
    guess = ""
    if candidates:
        guess = (
            "; by its name it may be "
            + ", ".join(f"{arch} ({label})" for arch, label in candidates)
            + " (check the model's config.json)"
        )
    return ConfigError(
        f"{what} {model_id!r} is not in policies/known_models.yaml and its "
        f"config.json was not found ({trail}){guess}; {hint}",
        code=ErrorCode.UNKNOWN_MODEL,
        field=field,
    )
