"""A real HTTP server answering the hub's file API the way huggingface_hub expects it.

``HEAD``/``GET /{repo_id}/resolve/{revision}/{filename}``: a branch or tag answers ``307`` to
``/api/resolve-cache/models/{repo_id}/{commit}/{filename}`` (relative, as the hub does for
files kept in git), a commit answers ``200`` with ``X-Repo-Commit``, ``ETag`` (the git blob id,
quoted) and ``Content-Length``. Errors carry the hub's ``X-Error-Code`` / ``X-Error-Message``
headers: ``RepoNotFound`` (401 without a token, 404 with one), ``GatedRepo`` (401 without a
token, 403 with one that has no access), ``RevisionNotFound`` (404), ``EntryNotFound`` (404,
with ``X-Repo-Commit``). Read from huggingface_hub's ``file_download.get_hf_file_metadata``,
``_get_metadata_or_catch_error`` and ``utils/_http.py hf_raise_for_status``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from threaded_server import serve_in_thread


def commit_of(text: str) -> str:
    """A 40-hex commit id made from ``text`` (deterministic, like a real commit id)."""
    return hashlib.sha1(text.encode()).hexdigest()


@dataclass
class Repo:
    """One model repository: refs (branch/tag -> commit) and files per commit."""

    refs: dict[str, str] = field(default_factory=dict)
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)
    gated_token: str | None = None  # set: a gated repo that this token may read

    def add_commit(self, name: str, configs: Mapping[str, Any], *refs: str) -> str:
        """A commit holding config.json = ``configs`` (other files: ``{name: bytes}``)."""
        commit = commit_of(name)
        self.files[commit] = {
            k: v if isinstance(v, bytes) else json.dumps(v).encode() for k, v in configs.items()
        }
        for ref in refs:
            self.refs[ref] = commit
        return commit


@dataclass
class HubServer:
    """The server, its repos and every request it saw (method, path, Authorization)."""

    repos: dict[str, Repo]
    httpd: ThreadingHTTPServer
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def start_hub(repos: dict[str, Repo]) -> HubServer:
    """Serve ``repos`` on 127.0.0.1 (a free port) in a daemon thread until ``stop()``."""
    server: HubServer

    class Handler(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _answer(self, *, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            server.requests.append((self.command, path, self.headers.get("Authorization")))
            status, headers, payload = _route(server.repos, path, self.headers)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if body:
                self.wfile.write(payload)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    server = HubServer(repos, httpd)
    serve_in_thread(httpd)
    return server


Answer = tuple[int, dict[str, str], bytes]


def _route(repos: dict[str, Repo], path: str, headers: Mapping[str, str]) -> Answer:
    cached = path.startswith("/api/resolve-cache/models/")
    if cached:
        repo_id, _, rest = path.removeprefix("/api/resolve-cache/models/").rpartition("/")
        repo_id, _, revision = repo_id.rpartition("/")
        filename = rest
    elif "/resolve/" in path:
        repo_id, _, rest = path.lstrip("/").partition("/resolve/")
        revision, _, filename = rest.partition("/")
    else:
        return _error(404, "", "Not Found", b"not a hub route")
    auth = headers.get("Authorization")
    repo = repos.get(repo_id)
    if repo is None:
        return _error(404 if auth else 401, "RepoNotFound", "Repository not found")
    if repo.gated_token is not None and auth != f"Bearer {repo.gated_token}":
        return _error(
            403 if auth else 401,
            "GatedRepo",
            f"Access to model {repo_id} is restricted and you are not in the authorized list.",
        )
    commit = repo.refs.get(revision, revision if revision in repo.files else None)
    if commit is None:
        return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
    content = repo.files[commit].get(filename)
    if content is None:
        return _error(
            404,
            "EntryNotFound",
            f'{filename} does not exist on "{revision}"',
            extra={"X-Repo-Commit": commit},
        )
    meta = {"X-Repo-Commit": commit, "ETag": f'"{_blob_id(content)}"'}
    if revision != commit and not cached:
        return (
            307,
            {**meta, "Location": f"/api/resolve-cache/models/{repo_id}/{commit}/{filename}"},
            b"",
        )
    return 200, {**meta, "Content-Type": "application/json"}, content


def _error(
    status: int, code: str, message: str, body: bytes = b"", extra: Mapping[str, str] | None = None
) -> Answer:
    headers = {"X-Error-Message": message, **(extra or {})}
    if code:
        headers["X-Error-Code"] = code
    return status, headers, body or json.dumps({"error": message}).encode()


def _blob_id(content: bytes) -> str:
    """The git blob id the hub sends as the ETag of a file kept in git."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()
