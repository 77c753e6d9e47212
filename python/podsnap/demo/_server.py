"""OpenAI-compatible HTTP front of the demo worker (stdlib only): /v1/chat/completions, /v1/models, /health."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from podsnap.demo._model import Model, detokenize, prompt_bytes

MAX_TOKENS_LIMIT = 512
DEFAULT_MAX_TOKENS = 16
MAX_BODY = 1 << 20


class BadRequest(ValueError):
    def __init__(self, message: str, param: str | None = None, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def parse_chat_request(body: bytes, model_id: str) -> tuple[str, int]:
    """The prompt and max_tokens of a chat completion request, or BadRequest naming the field."""
    try:
        req = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from e
    if not isinstance(req, dict):
        raise BadRequest("request body must be a JSON object with 'messages'")
    model = req.get("model", model_id)
    if model != model_id:
        raise BadRequest(
            f"model {model!r} does not exist; this worker serves {model_id!r}", "model", HTTPStatus.NOT_FOUND
        )
    if req.get("stream"):
        raise BadRequest("'stream': true is not supported by the demo worker; omit it", "stream")
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest('\'messages\' must be a non-empty list of {"role": ..., "content": ...}', "messages")
    lines = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise BadRequest(f"'messages[{i}]' must be an object with string 'role' and 'content'", f"messages[{i}]")
        lines.append(f"{m['role']}: {m['content']}")
    max_tokens = req.get("max_tokens", req.get("max_completion_tokens", DEFAULT_MAX_TOKENS))
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise BadRequest(
            f"'max_tokens' must be an integer from 1 to {MAX_TOKENS_LIMIT}, got {max_tokens!r}", "max_tokens"
        )
    return "\n".join(lines), max_tokens


class DemoServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # HTTP/1.0 (the handler's default) closes every connection after its response, so no established
    # connection outlives a request: nothing for the checkpoint to carry but the listening socket

    def __init__(
        self,
        address: tuple[str, int],
        model: Model,
        model_id: str,
        identity: Mapping[str, Any],
        health: Callable[[], dict[str, Any]],
    ) -> None:
        super().__init__(address, Handler)
        self.model = model
        self.model_id = model_id
        self.identity = dict(identity)
        self.health = health
        self.created = int(time.time())
        #: held while a request generates; quiesce takes it to let in-flight generation finish
        self.generation = threading.Lock()
        #: set by `POST /podsnap/offer` (workers started with --offer-on-request wait for it before quiescing)
        self.offer = threading.Event()


class Handler(BaseHTTPRequestHandler):
    server: DemoServer
    server_version = "podsnap-demo"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Podsnap-Init-Id", str(self.server.identity["init_id"]))
        self.send_header("X-Podsnap-Pid", str(os.getpid()))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, e: BadRequest) -> None:
        kind = "not_found_error" if e.status == HTTPStatus.NOT_FOUND else "invalid_request_error"
        self._send(e.status, {"error": {"message": str(e), "type": kind, "param": e.param}, "podsnap": self._meta()})

    def _meta(self) -> dict[str, Any]:
        return {**self.server.identity, "pid": os.getpid()}

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/health":
            payload = {"status": "ok", **self._meta(), **self.server.health()}
            if parse_qs(url.query).get("checksum") in (["1"], ["true"]):
                with self.server.generation:
                    t0 = time.monotonic()
                    payload["weights_checksum"] = self.server.model.checksum()
                    payload["checksum_s"] = time.monotonic() - t0
            self._send(HTTPStatus.OK, payload)
        elif url.path == "/v1/models":
            model = {
                "id": self.server.model_id,
                "object": "model",
                "created": self.server.created,
                "owned_by": "podsnap",
            }
            self._send(HTTPStatus.OK, {"object": "list", "data": [model], "podsnap": self._meta()})
        else:
            self._error(BadRequest(f"no route GET {url.path}; try /v1/models or /health", None, HTTPStatus.NOT_FOUND))

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/podsnap/offer":
            self.server.offer.set()
            self._send(HTTPStatus.ACCEPTED, {"offered": True, "podsnap": self._meta()})
            return
        if url.path != "/v1/chat/completions":
            self._error(BadRequest(f"no route POST {url.path}; try /v1/chat/completions", None, HTTPStatus.NOT_FOUND))
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 <= length <= MAX_BODY:
                raise BadRequest(f"request body must be at most {MAX_BODY} bytes, got Content-Length {length}")
            prompt, max_tokens = parse_chat_request(self.rfile.read(length), self.server.model_id)
        except BadRequest as e:
            self._error(e)
            return
        except ValueError:
            self._error(BadRequest("Content-Length must be an integer"))
            return
        t0 = time.monotonic()
        with self.server.generation:
            tokens = self.server.model.generate(prompt, max_tokens)
        n_prompt = len(prompt_bytes(prompt))
        self._send(
            HTTPStatus.OK,
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.server.model_id,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": detokenize(tokens)},
                        "finish_reason": "length",
                    }
                ],
                "usage": {
                    "prompt_tokens": n_prompt,
                    "completion_tokens": len(tokens),
                    "total_tokens": n_prompt + len(tokens),
                },
                "podsnap": {**self._meta(), "tokens": tokens, "generate_s": time.monotonic() - t0},
            },
        )
