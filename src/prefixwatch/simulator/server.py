"""The simulator's HTTP face: vLLM's OpenAI-compatible API and /metrics, one port per replica."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST

from prefixwatch.core.httpreply import ReplyHandler
from prefixwatch.core.logs.builtin_tokenizer import Tokenizer, apply_chat_template, shared_tokenizer
from prefixwatch.simulator.engine import Engine, EngineConfig, EngineThread, SimRequest
from prefixwatch.simulator.kvpublisher import (
    KVEventPublisher,
    KVEvents,
    KVEventSink,
    KVEventsOptions,
    offset_endpoint,
)
from prefixwatch.simulator.metrics import PageMetrics
from prefixwatch.simulator.requestlog import RequestLogger
from prefixwatch.simulator.sglangengine import SGLangEngine
from prefixwatch.simulator.sglangevents import SGLangEventSink, encode_sglang_batch

log = logging.getLogger("prefixwatch.simulate")

MAX_BODY = 16 * 1024 * 1024
#: Seconds one read of a request may wait; the listen backlog; concurrent handler threads.
REQUEST_TIMEOUT = 10.0
LISTEN_BACKLOG = 128
MAX_THREADS = 256


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Replica:
    """One simulated server: engine, scheduler thread, metrics, tokenizer, LoRA adapters."""

    def __init__(self, config: EngineConfig, index: int = 0, server: str = "vllm",
                 tokenizer: Tokenizer | None = None, lora_modules: tuple[str, ...] = (),
                 request_log: RequestLogger | None = None,
                 kv_events: KVEventsOptions | None = None) -> None:
        self.config = config
        self.index = index
        self.server = server
        self.tokenizer = tokenizer or shared_tokenizer()
        self.lora_modules = tuple(lora_modules)
        self.request_log = request_log
        #: How a fleet log names this replica.
        self.name = f"replica-{index}"
        self.engine = SGLangEngine(config) if server == "sglang" else Engine(config)
        self.engine.set_answer_vocabulary(self.tokenizer.answer_ids)
        self.metrics = PageMetrics(self.engine, server)
        self._thread = EngineThread(self.engine)
        self.started_at = time.time()
        #: vLLM's KV event publisher (``--kv-events-config`` with a ZMQ endpoint); None when off.
        self.kv_publisher: KVEventPublisher | None = None
        if kv_events is not None:
            self.kv_publisher = KVEventPublisher(
                offset_endpoint(kv_events.endpoint, index), topic=kv_events.topic,
                replay_endpoint=(offset_endpoint(kv_events.replay_endpoint, index)
                                 if kv_events.replay_endpoint else None), bind=True,
                encode=encode_sglang_batch if server == "sglang" else None)
            lora_ids = {name: i + 1 for i, name in enumerate(self.lora_modules)}
            sink = (SGLangEventSink() if server == "sglang"
                    else KVEventSink(config.block_size, lora_ids=lora_ids))
            self.engine.attach_kv_events(KVEvents(sink, self.kv_publisher))

    def start(self) -> None:
        if self.kv_publisher is not None:
            self.kv_publisher.start()
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()
        if self.kv_publisher is not None:
            self.kv_publisher.stop()

    def close(self) -> None:
        """Release what was bound without being started."""
        if self.kv_publisher is not None:
            self.kv_publisher.stop()

    def restart(self) -> None:
        """A server restart: cold cache and counters from zero, as a new process has."""
        self.engine.restart()
        self.metrics = PageMetrics(self.engine, self.server)
        self.started_at = time.time()
        log.info("replica %d restarted: cache and counters cleared", self.index)

    # -- requests ------------------------------------------------------------------------------

    def extra_keys(self, model: str | None, cache_salt: str | None) -> tuple | None:
        lora = None
        if model and model != self.config.model:
            if model not in self.lora_modules:
                raise BadRequest(f"The model `{model}` does not exist.", 404)
            lora = model
        if lora is None and cache_salt is None:
            return None
        return (lora, cache_salt)

    def submit(self, prompt: list[int], max_tokens: int, extra_keys: tuple | None,
               prompt_text: str | None = None) -> SimRequest:
        try:
            req = self.engine.submit(prompt, max_tokens, extra_keys,
                                     request_id=f"cmpl-{uuid.uuid4().hex}")
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        except OverflowError as exc:
            raise BadRequest(str(exc), 503) from exc
        if self.request_log is not None:
            self.request_log.log(req.request_id, prompt_text, prompt, extra_keys, self.name,
                                 max_tokens)
        return req

    def tokenize_prompt(self, prompt: Any) -> tuple[list[int], str | None]:
        """A completion prompt as vLLM takes it: text (BOS added) or a list of token ids."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise BadRequest("prompt is empty")
            return self.tokenizer.encode_prompt(prompt), prompt
        if isinstance(prompt, list) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
            return list(prompt), None
        raise BadRequest("prompt must be a string or a non-empty list of token ids")

    def tokenize_chat(self, body: dict[str, Any]) -> tuple[list[int], str]:
        try:
            text = apply_chat_template(body.get("messages"), body.get("tools"),
                                       bool(body.get("add_generation_prompt", True)))
        except ValueError as exc:
            raise BadRequest(str(exc)) from exc
        return self.tokenizer.encode(text), text


def _max_tokens(body: dict[str, Any], default: int = 16) -> int:
    value = body.get("max_tokens", body.get("max_completion_tokens", default))
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest("max_tokens must be a positive integer")
    return value


def _wait(req: SimRequest) -> None:
    if not req.done.wait(REQUEST_TIMEOUT):
        raise BadRequest("request timed out in the simulator", 504)
    if req.error:
        raise BadRequest(req.error, 503)


def _usage(req: SimRequest, server: str = "vllm") -> dict[str, Any]:
    details: dict[str, int] | None = {"cached_tokens": req.cached_tokens}
    if server == "sglang" and not req.cached_tokens:
        details = None  # SGLang (--enable-cache-report) leaves the details out at 0
    return {
        "prompt_tokens": req.num_prompt_tokens,
        "completion_tokens": len(req.output),
        "total_tokens": req.num_prompt_tokens + len(req.output),
        "prompt_tokens_details": details,
    }


class ReplicaHandler(ReplyHandler):
    """vLLM's routes on one replica (``make_handler`` binds the replica)."""

    replica: Replica
    server_version = "prefixwatch-simulator"
    protocol_version = "HTTP/1.1"
    timeout = REQUEST_TIMEOUT  # per read: a stalled client frees its thread

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("replica %d: " + format, self.replica.index, *args)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _error(self, status: int, message: str) -> None:
        kind = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed",
                413: "RequestTooLarge", 503: "ServiceUnavailable",
                504: "Timeout"}.get(status, "Error")
        self._json(status, {"error": {"message": message, "type": kind, "param": None,
                                      "code": status}})

    def do_GET(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        if path == "/metrics":
            self._send(200, self.replica.metrics.render(), CONTENT_TYPE_LATEST)
        elif path in ("/health", "/ping"):
            self._send(200, b"", "application/json")
        elif path == "/v1/models":
            base, adapters = self.replica.config.model, self.replica.lora_modules
            self._json(200, {"object": "list", "data": [
                {"id": name, "object": "model", "created": int(self.replica.started_at),
                 "owned_by": "vllm", "root": name, "parent": parent,
                 "max_model_len": self.replica.config.max_model_len}
                for name, parent in ((base, None), *((n, base) for n in adapters))]})
        elif path in ("/v1/completions", "/v1/chat/completions", "/tokenize",
                      "/detokenize"):
            self._error(405, "Method Not Allowed")
        else:
            self._error(404, "Not Found")

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        if path == "/reset_prefix_cache":
            # vLLM's endpoint (VLLM_SERVER_DEV_MODE=1): drop every cached block.
            if self.replica.engine.reset_prefix_cache():
                log.info("replica %d: prefix cache reset", self.replica.index)
                self._send(200, b"", "application/json")
            else:
                self._error(503, "requests are running: the prefix cache was not reset")
            return
        try:
            body = self._json_body()
            if path == "/v1/completions":
                self._completions(body)
            elif path == "/v1/chat/completions":
                self._chat(body)
            elif path == "/tokenize":
                self._tokenize(body)
            elif path == "/detokenize":
                tokens = body.get("tokens")
                if not isinstance(tokens, list) or not all(isinstance(t, int)
                                                           for t in tokens):
                    raise BadRequest("tokens must be a list of integers")
                self._json(200, {"prompt": self.replica.tokenizer.decode(tokens)})
            else:
                raise BadRequest("Not Found", 404)
        except BadRequest as exc:
            self._error(exc.status, str(exc))
        except (TypeError, ValueError, AttributeError, KeyError, IndexError,
                RecursionError) as exc:
            # A body of the right JSON shape but wrong types ("tools": 5) is the
            # client's error, as in vLLM: a 400 with a JSON error, never a dropped line.
            self._error(400, f"invalid request body: {type(exc).__name__}")

    def _json_body(self) -> dict[str, Any]:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise BadRequest("a JSON body with Content-Length is required")
        if int(length) > MAX_BODY:
            raise BadRequest("request body too large", 413)
        try:
            raw = self.rfile.read(int(length))
        except TimeoutError:
            self.close_connection = True
            raise BadRequest("request body shorter than its Content-Length") from None
        if len(raw) < int(length):
            self.close_connection = True
            raise BadRequest("request body shorter than its Content-Length")
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"malformed JSON: {exc}") from exc
        except RecursionError:
            raise BadRequest("malformed JSON: nested too deeply") from None
        if not isinstance(body, dict):
            raise BadRequest("the JSON body must be an object")
        return body

    def _extra(self, body: dict[str, Any]) -> tuple | None:
        salt = body.get("cache_salt")
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise BadRequest("cache_salt must be a non-empty string")
        return self.replica.extra_keys(body.get("model"), salt)

    def _completions(self, body: dict[str, Any]) -> None:
        if "prompt" not in body:
            raise BadRequest("'prompt' is required")
        extra = self._extra(body)
        prompt, text = self.replica.tokenize_prompt(body["prompt"])
        req = self.replica.submit(prompt, _max_tokens(body), extra, text)
        _wait(req)
        self._json(200, {
            "id": req.request_id, "object": "text_completion", "created": int(time.time()),
            "model": body.get("model") or self.replica.config.model,
            "choices": [{"index": 0, "text": self.replica.tokenizer.decode(req.output),
                         "logprobs": None, "finish_reason": req.finish_reason,
                         "stop_reason": None}],
            "usage": _usage(req, self.replica.server),
        })

    def _chat(self, body: dict[str, Any]) -> None:
        if "messages" not in body:
            raise BadRequest("'messages' is required")
        extra = self._extra(body)
        prompt, text = self.replica.tokenize_chat(body)
        req = self.replica.submit(prompt, _max_tokens(body), extra, text)
        _wait(req)
        self._json(200, {
            "id": f"chat{req.request_id}", "object": "chat.completion",
            "created": int(time.time()), "model": body.get("model") or self.replica.config.model,
            "choices": [{"index": 0, "message": {
                "role": "assistant", "content": self.replica.tokenizer.decode(req.output)},
                "logprobs": None, "finish_reason": req.finish_reason, "stop_reason": None}],
            "usage": _usage(req, self.replica.server),
        })

    def _tokenize(self, body: dict[str, Any]) -> None:
        if "messages" in body:
            tokens, _ = self.replica.tokenize_chat(body)
        elif "prompt" in body:
            prompt = body["prompt"]
            if not isinstance(prompt, str):
                raise BadRequest("prompt must be a string")
            tokens = (self.replica.tokenizer.encode_prompt(prompt)
                      if body.get("add_special_tokens", True)
                      else self.replica.tokenizer.encode(prompt))
        else:
            raise BadRequest("'prompt' or 'messages' is required")
        payload: dict[str, Any] = {"count": len(tokens),
                                   "max_model_len": self.replica.config.max_model_len,
                                   "tokens": tokens, "token_strs": None}
        if body.get("return_token_strs"):
            payload["token_strs"] = [self.replica.tokenizer.piece(t) for t in tokens]
        self._json(200, payload)


def make_handler(replica: Replica) -> type[ReplicaHandler]:
    """The handler class of one replica's server (its read timeout as the module says now)."""
    return type("Handler", (ReplicaHandler,), {"replica": replica, "timeout": REQUEST_TIMEOUT})


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, but at most MAX_THREADS at once (the rest wait in the listen
    backlog), so a flood of slow clients cannot exhaust the process."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_THREADS)

    def process_request(self, request, client_address) -> None:  # noqa: ANN001
        self._slots.acquire()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:  # noqa: ANN001
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001
        """A client that left before its answer was written (a poller's deadline passed on
        a loaded machine) is a debug line, not a traceback on stderr."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            log.debug("client %s left before its answer was written", client_address)
            return
        super().handle_error(request, client_address)


class ReplicaServer:
    """A Replica bound to a port."""

    def __init__(self, replica: Replica, host: str, port: int) -> None:
        self.replica = replica
        try:
            self.httpd = _BoundedServer((host, port), make_handler(replica))
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
        # A short poll, so shutdown() returns at once: SIGTERM ends the simulator within 2 s.
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                        daemon=True, name=f"replica-{replica.index}")

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> None:
        self.replica.start()
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.replica.stop()
