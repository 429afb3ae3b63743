"""Where the operator commands send their calls: a service URL and a token, from
``TURNOUT_URL`` / ``TURNOUT_TOKEN`` or from a context of the config file, as kubectl and gh keep
them.

The file is ``$XDG_CONFIG_HOME/turnout/config.yaml`` (``~/.config/turnout/config.yaml`` when
``XDG_CONFIG_HOME`` is unset, empty or relative, which the XDG specification says to ignore)::

    current-context: prod
    contexts:
      prod:
        url: https://turnout.internal
        token_env: TURNOUT_PROD_TOKEN     # the token is read from this variable
      local:
        url: http://127.0.0.1:8000
        token: tok_...                   # or kept in the file (then readable by its owner only)

Which one a command uses: ``--context NAME``; else ``TURNOUT_URL`` (with ``TURNOUT_TOKEN``);
else the file's ``current-context``; else none (the command says how to set one). A file
that keeps a token and that others may read is refused, as ssh refuses such a key.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from turnout.oracle.errors import PackError
from turnout.oracle.yamlpos import Positions, load_text_with_positions, read_text

ENV_URL = "TURNOUT_URL"
ENV_TOKEN = "TURNOUT_TOKEN"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTEXT_KEYS = ("url", "token", "token_env")
#: What a bearer token may hold (RFC 6750's b64token is narrower; this is what a header takes).
TOKEN_PATTERN = re.compile(r"[\x21-\x7e]+")


class ConfigError(Exception):
    """The config file cannot be used (its message names file:line), or a context it does
    not hold was asked for."""


@dataclass(frozen=True)
class Target:
    """A service to call: its base URL and token, each with where it came from (for
    messages: ``TURNOUT_URL``, ``context 'prod' of ~/.config/turnout/config.yaml``)."""

    url: str
    token: str | None
    url_source: str
    token_source: str


@dataclass(frozen=True)
class Context:
    """One entry of ``contexts``: a URL and a token kept in the file or in a variable."""

    name: str
    url: str
    token: str | None = None
    token_env: str | None = None

    def describe_token(self) -> str:
        if self.token is not None:
            return "token in the file"
        if self.token_env is not None:
            return f"${self.token_env}"
        return f"${ENV_TOKEN}"


@dataclass
class Config:
    """The config file's contexts and the current one (``path`` need not exist yet)."""

    path: Path
    contexts: dict[str, Context] = field(default_factory=dict)
    current: str | None = None


def config_path(environ: Mapping[str, str]) -> Path:
    """``$XDG_CONFIG_HOME/turnout/config.yaml``, or ``~/.config/turnout/config.yaml`` when
    ``XDG_CONFIG_HOME`` is unset, empty or relative."""
    home = Path(environ.get("XDG_CONFIG_HOME", ""))
    if not home.is_absolute():
        home = Path(environ.get("HOME") or Path.home()) / ".config"
    return home / "turnout" / "config.yaml"


def check_url(url: str) -> str:
    """The service's base URL: ``url`` without a trailing slash or ``/api/v1`` (the API's
    prefix, which the client adds). Raises ConfigError when it is not an http:// or https://
    URL with a host, or holds a user or password (never echoed)."""
    authority = url.strip().partition("://")[2].split("/", 1)[0]
    if "@" in authority:
        # Never echoed: the user part may hold a password. The token goes in token/token_env.
        raise ConfigError(
            "a service URL with a user or password before '@' is refused (it would be shown "
            "in messages): give the token with --token, TURNOUT_TOKEN, token or token_env"
        )
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 (a port that is not 0..65535 raises here)
    except ValueError:  # "http://[::1": an unclosed IPv6 bracket; "h:abc"; "h:99999"
        raise ConfigError(
            f"{url!r} is not a service URL: its host or port cannot be read"
        ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{url!r} is not a service URL: use http://HOST:PORT or https://HOST "
            "(the service's base URL)"
        )
    return url.strip().rstrip("/").removesuffix("/api/v1")


def check_context(context: Context) -> None:
    """Raises ConfigError when the name is not a plain name (letters, digits, ``.``, ``_``,
    ``-``), or ``token_env`` not a variable name, or both token and token_env are given."""
    if not _NAME.fullmatch(context.name):
        raise ConfigError(f"context name {context.name!r}: letters, digits, '.', '_', '-'")
    if context.token is not None and context.token_env is not None:
        raise ConfigError(f"context {context.name!r}: give token or token_env, not both")
    if context.token_env is not None and not _ENV_NAME.fullmatch(context.token_env):
        raise ConfigError(
            f"context {context.name!r}: token_env {context.token_env!r} is not a variable name"
        )


def load(path: Path) -> Config:
    """The contexts of the file at ``path`` (none when it does not exist).

    Raises:
        ConfigError: the file cannot be read, is not YAML, does not have the shape above
            (``file:line: what``), or keeps a token while group or others may read it.
    """
    if not path.exists():
        return Config(path)
    try:
        text = read_text(path)
        data, pos = load_text_with_positions(text, str(path))
    except PackError as err:
        raise ConfigError(
            "\n".join(f"{i.file}:{i.line}: {i.message}" for i in err.issues)
        ) from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    config = _parse(path, data, pos)
    if any(c.token is not None for c in config.contexts.values()):
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"{path} keeps a token and others may read it (mode {mode:04o}): "
                f"chmod 600 {path}, or keep the token in a variable (token_env)"
            )
    return config


def _parse(path: Path, data: Any, pos: Positions) -> Config:
    def bad(where: tuple[str | int, ...], message: str) -> ConfigError:
        line, _col = pos.at(where)
        return ConfigError(f"{path}:{line}: {message}")

    if data is None:
        return Config(path)
    if not isinstance(data, dict):
        raise bad((), "expected a mapping with contexts and current-context")
    for key in data:
        if key not in ("contexts", "current-context"):
            raise bad((key,), f"unknown key {key!r} (contexts, current-context)")
    entries = data.get("contexts") or {}
    if not isinstance(entries, dict):
        raise bad(("contexts",), "contexts: expected a mapping of name → {url, token_env}")
    contexts = {}
    for name, entry in entries.items():
        where: tuple[str | int, ...] = ("contexts", name)
        if not isinstance(name, str):
            raise bad(where, f"context name {name!r}: letters, digits, '.', '_', '-'")
        if not isinstance(entry, dict):
            raise bad(where, f"context {name!r}: expected a mapping with url and token_env")
        for key in entry:
            if key not in _CONTEXT_KEYS:
                raise bad(
                    (*where, key), f"context {name!r}: unknown key {key!r} (url, token, token_env)"
                )
        values = {}
        for key in _CONTEXT_KEYS:
            value = entry.get(key)
            if value is not None and not isinstance(value, str):
                raise bad((*where, key), f"context {name!r}: {key} is not a string")
            values[key] = value
        if values["url"] is None:
            raise bad(where, f"context {name!r} has no url")
        try:
            url = check_url(values["url"])
        except ConfigError as err:
            raise bad((*where, "url"), f"context {name!r}: {err}") from None
        context = Context(name, url, values["token"], values["token_env"])
        try:
            check_context(context)
        except ConfigError as err:
            raise bad(where, str(err)) from None
        contexts[name] = context
    current = data.get("current-context")
    if current is not None and not isinstance(current, str):
        raise bad(("current-context",), "current-context is not a context name")
    if current is not None and current not in contexts:
        raise bad(
            ("current-context",),
            f"current-context {current!r} is not a context ({', '.join(contexts) or 'none'})",
        )
    return Config(path, contexts, current)


def save(config: Config) -> None:
    """Write the file (its comments are not kept), readable by its owner only, in one step
    (a reader sees the old file or the new one). Raises ConfigError when it cannot be
    written."""
    body: dict[str, Any] = {}
    if config.current is not None:
        body["current-context"] = config.current
    body["contexts"] = {
        c.name: {
            k: v for k, v in (("url", c.url), ("token", c.token), ("token_env", c.token_env)) if v
        }
        for c in config.contexts.values()
    }
    text = yaml.safe_dump(body, sort_keys=False, allow_unicode=True)
    tmp = config.path.with_name(config.path.name + ".tmp")
    try:
        config.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o600)  # an old .tmp file kept its mode through O_TRUNC
        os.replace(tmp, config.path)
    except OSError as err:
        raise ConfigError(f"cannot write {config.path}: {err.strerror or err}") from None


@contextlib.contextmanager
def editing(path: Path) -> Iterator[Config]:
    """The file's contexts, to change and write back (``save``) while no other
    ``turnout context`` command does: an exclusive lock on ``config.yaml.lock`` beside it is
    held from the read to the write, so that two shells setting contexts at once keep both.

    Raises:
        ConfigError: as ``load``, or the lock file cannot be made.
    """
    lock = path.with_name(path.name + ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT, 0o600)
    except OSError as err:
        raise ConfigError(f"cannot lock {lock}: {err.strerror or err}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield load(path)
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def resolve(
    environ: Mapping[str, str],
    context: str | None = None,
    *,
    url: str | None = None,
    token: str | None = None,
) -> Target | None:
    """The service the command calls: ``--context`` (``context``); else ``url`` (a command's
    own ``--url``) or ``TURNOUT_URL``, with ``token`` or ``TURNOUT_TOKEN``; else the config
    file's current context; None when none of these is set. ``token`` (``--token``) wins
    over the token of any of them.

    Raises:
        ConfigError: the config file cannot be used, ``context`` is not one of its contexts,
            or a URL is not an http(s) URL.
    """
    if context is None:
        given = url or environ.get(ENV_URL, "").strip()
        if given:
            source = "--url" if url else ENV_URL
            if token:
                return Target(check_url(given), token, source, "--token")
            return Target(check_url(given), environ.get(ENV_TOKEN) or None, source, ENV_TOKEN)
    path = config_path(environ)
    config = load(path)
    name = context if context is not None else config.current
    if name is None:
        return None
    chosen = config.contexts.get(name)
    if chosen is None:
        known = ", ".join(config.contexts) or f"none: {path} holds no context"
        raise ConfigError(f"no context {name!r} ({known})")
    where = f"context {name!r} of {path}"
    if token:
        return Target(chosen.url, token, where, "--token")
    if chosen.token is not None:
        return Target(chosen.url, chosen.token, where, f"the token of {where}")
    variable = chosen.token_env or ENV_TOKEN
    return Target(chosen.url, environ.get(variable) or None, where, f"${variable} ({where})")
