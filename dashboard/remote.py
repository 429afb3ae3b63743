"""The operator commands' HTTP client: the service's JSON API (``/api/v1``) with a bearer
token, so that a command goes through the same RBAC, If-Match versions and audit log as the
pages, as the token's holder.

Every answer that is not a success becomes a :class:`RemoteError` whose message is the
service's own (``{"detail": {"code", "message"}}``) and whose exit code follows the command
line's rule: 2 for what was asked (an unknown id or cohort, a refused value, approving one's
own request), 1 for the rest (the service unreachable, the token refused or too weak, a
version conflict).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from turnout.dashboard.contexts import ENV_URL, TOKEN_PATTERN, Target
from turnout.oracle.errors import ErrorCode

API = "/api/v1"
TIMEOUT_S = 30.0
BAD_INPUT = 2
_BAD_INPUT_STATUSES = (400, 404, 422)


class RemoteError(Exception):
    """A call that did not succeed: ``message`` says why, ``exit_code`` is 1 or 2 (see the
    module), ``status`` and ``code`` are the service's (None: no answer)."""

    def __init__(
        self, message: str, exit_code: int = 1, status: int | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.status = status
        self.code = code


@dataclass(frozen=True)
class Reply:
    """A successful answer: its status, JSON body and ETag."""

    status: int
    body: Any
    etag: str | None

    def version(self) -> int:
        """The version of the ETag (``"3"`` → 3). Raises RemoteError when there is none."""
        value = (self.etag or "").removeprefix("W/").strip('"')
        if not value.isdigit():
            raise RemoteError(f"the service sent no version (ETag {self.etag!r})")
        return int(value)


class Remote:
    """Calls to one service as one token (use as a context manager, or ``close()``)."""

    def __init__(self, target: Target, *, timeout_s: float = TIMEOUT_S) -> None:
        """Raises RemoteError when the target has no token (nothing is sent)."""
        if not target.token:
            raise RemoteError(
                f"no token for the service at {target.url} ({target.url_source}): "
                f"{target.token_source} is not set; set it to a token of the service (an "
                "operator's; an admin's for tokens and webhooks)"
            )
        if not TOKEN_PATTERN.fullmatch(target.token):
            # httpx would refuse the header later with the value in its message: say where
            # the token came from and never echo it.
            raise RemoteError(
                f"the token from {target.token_source} holds a space, a line break or another "
                "character a token never has (it is not shown): set it again"
            )
        self.target = target
        self._client = httpx.Client(
            base_url=target.url,
            timeout=timeout_s,
            headers={"Authorization": f"Bearer {target.token}", "Accept": "application/json"},
            follow_redirects=False,  # a redirect is reported, never followed with the token
        )

    def __enter__(self) -> Remote:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def get(self, path: str, params: dict[str, Any] | None = None) -> Reply:
        """``GET /api/v1{path}``. Raises RemoteError."""
        given = {k: v for k, v in (params or {}).items() if v is not None}
        return self._call("GET", path, params=given)

    def post(self, path: str, body: Any, *, if_match: int | None = None) -> Reply:
        """``POST /api/v1{path}`` with a JSON body (and ``If-Match``). Raises RemoteError."""
        return self._call("POST", path, json=body, if_match=if_match)

    def patch(self, path: str, body: Any, *, if_match: int) -> Reply:
        """``PATCH /api/v1{path}`` with ``If-Match``. Raises RemoteError."""
        return self._call("PATCH", path, json=body, if_match=if_match)

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        if_match: int | None = None,
    ) -> Reply:
        headers = {"If-Match": f'"{if_match}"'} if if_match is not None else {}
        try:
            r = self._client.request(method, API + path, params=params, json=json, headers=headers)
        except httpx.HTTPError as err:
            raise RemoteError(
                f"cannot reach the service at {self.target.url} ({self.target.url_source}): "
                f"{err or type(err).__name__}"
            ) from None
        if not r.is_success:
            raise self._refusal(r)
        try:
            body = r.json() if r.content else None
        except ValueError:
            raise RemoteError(
                f"{method} {r.url} answered {r.status_code} without JSON: is {self.target.url} "
                f"({self.target.url_source}) the turnout service?"
            ) from None
        return Reply(r.status_code, body, r.headers.get("etag"))

    def _refusal(self, r: httpx.Response) -> RemoteError:
        target = self.target
        if r.is_redirect:
            return RemoteError(
                f"the service at {target.url} ({target.url_source}) answered {r.status_code} "
                f"to {r.headers.get('location', '?')}: set {ENV_URL} (or the context's url) "
                "to the address it names",
                status=r.status_code,
            )
        try:
            detail = r.json()["detail"]
            code, message = str(detail["code"]), str(detail["message"])
        except (ValueError, KeyError, TypeError):
            return RemoteError(
                f"{r.request.method} {r.url} answered {r.status_code} {r.reason_phrase} "
                f"without turnout's error shape: is {target.url} "
                f"({target.url_source}) the turnout service?",
                status=r.status_code,
            )
        if r.status_code == 401:
            return RemoteError(
                f"the service at {target.url} refused the token ({target.token_source}): {message}",
                status=401,
                code=code,
            )
        if r.status_code == 403 and code == ErrorCode.FORBIDDEN:
            return RemoteError(f"{message} (token: {target.token_source})", status=403, code=code)
        if r.status_code in (404, 405) and message in ("Not Found", "Method Not Allowed"):
            return RemoteError(  # a route the service does not have: another version of it
                f"the service at {target.url} has no {r.request.method} {r.url.path} "
                f"({message}): is it an older turnout than this command line?",
                status=r.status_code,
                code=code,
            )
        if code == ErrorCode.INVALID_REQUEST:  # "body field reason: ..." → "reason: ..."
            message = message.replace("body field ", "")
        bad_input = r.status_code in _BAD_INPUT_STATUSES or r.status_code == 403
        return RemoteError(message, BAD_INPUT if bad_input else 1, r.status_code, code)
