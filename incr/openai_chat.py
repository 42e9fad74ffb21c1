"""A generator for ``@incr.llm`` nodes that calls an OpenAI-compatible chat endpoint.

Optional: it needs the official ``openai`` package (``pip install 'incr[openai]'``), imported
only when :func:`chat_generator` is called. It works with OpenAI itself and with any server
that speaks the chat-completions protocol (llama.cpp's ``llama-server``, vLLM, Ollama, ...)
through ``base_url``::

    gen = chat_generator("gpt-4o-mini", system="You write SQLite SQL. Reply with SQL only.")

    @incr.llm(validators=[sql_tests], version=f"prompt-v1/{gen.fingerprint}")
    def write_sql(request: str, *, previous=None, feedback=()):
        return gen(f"Write SQL for: {request}", previous=previous, feedback=feedback)

What one call sends (``gen.messages(...)`` returns it without sending anything):

- the ``system`` message, if any, then the prompt as a user message;
- when ``previous`` is given (the node is asking again after a rejection): the previous
  candidate as an assistant message, then a user message listing each NACK of ``feedback``
  (case, message, counterexample as compact JSON, else its ``repr``) and asking for a
  corrected answer;
- ``feedback`` without ``previous`` is never dropped: it is added to the prompt's user turn.

It returns ``incr.Candidate(value, tokens=usage.total_tokens, cost=...)``; ``cost`` is computed
only when ``price_per_token`` is given.

Patch mode (``chat_generator(..., patch=True)``): when ``previous`` is a string (a retry), the
last user message asks instead for a minimal edit of the previous answer, as a unified diff in
one fenced block; the diff is applied with :func:`incr.patches.apply_patch` (strictly) and the
candidate is the patched text, with ``patch=`` the diff and ``rationale=`` the reply's words
outside the block. A reply with no diff, a diff that does not apply, or a reply cut short
(``finish_reason="length"``) costs one more call: the full-answer request of the normal mode,
and that candidate (``patch=None``) carries the tokens and cost of both calls.

The SDK's exceptions are never caught or wrapped: their class names and ``status_code`` are
what tells ``incr`` to retry a rate limit, a timeout, a connection error or a 5xx with backoff,
and to let anything else (a bad request, a wrong key) reach the caller.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any

from incr.llmnodes import Candidate
from incr.patches import PatchError, apply_patch, split_reply

__all__ = ["AsyncChatGenerator", "ChatGenerator", "chat_generator", "render_feedback"]

#: What patch mode asks for, after the feedback (the default renderer's last line, or added
#: after what a custom ``render`` returns).
PATCH_REQUEST = ("Reply with a minimal edit of that answer that passes every check above: a "
                 "unified diff against it, in one ```diff fenced block (hunks headed "
                 "'@@ -start,count +start,count @@', every context and removed line exactly "
                 "as in the answer). Outside the block, say in a sentence what you changed "
                 "and why.")

#: Sent as the API key when ``base_url`` is given and no key is (a local server needs none,
#: but the SDK refuses to start without one).
LOCAL_API_KEY = "sk-no-key-required"

_INSTALL = ("incr.openai_chat needs the official 'openai' package: "
            "pip install 'incr[openai]'  (or: pip install openai)")


def _import_openai():
    try:
        import openai
    except ImportError as e:
        raise ImportError(f"{_INSTALL} ({e})") from e
    return openai


def _compact(value: Any) -> str:
    """``value`` as compact JSON, or its ``repr`` when it is not JSON."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return repr(value)


def _clip(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters not shown)"


def _as_text(candidate: Any) -> str:
    """A candidate as the assistant's words: a string as it is, anything else as JSON."""
    return candidate if isinstance(candidate, str) else _compact(candidate)


def render_feedback(feedback: Iterable[Any], max_counterexample_chars: int | None = 4000,
                    *, previous_shown: bool = True, patch: bool = False) -> str:
    """The user message that follows the previous candidate: one entry per verdict of
    ``feedback`` (its case, its message, its counterexample as compact JSON, else ``repr``),
    then the request for a corrected answer (with ``patch=True``: for a minimal edit as a
    unified diff, :data:`PATCH_REQUEST`). With ``previous_shown=False`` (feedback given
    without the candidate it judged) it speaks of "an earlier answer" instead."""
    items = list(feedback)
    patch = patch and previous_shown
    if not items:
        if patch:
            return f"That answer was not accepted. {PATCH_REQUEST}"
        return ("That answer was not accepted. Write a corrected answer, in the same form "
                "as before.")
    if not previous_shown:
        lines = ["An earlier answer was rejected by these checks:"]
    else:
        lines = ["That answer was rejected by these checks:"]
    for i, v in enumerate(items, 1):
        head = f"{i}. case {getattr(v, 'case', '?')!s}"
        message = getattr(v, "message", "")
        lines.append(f"{head}: {message}" if message else head)
        cex = getattr(v, "counterexample", None)
        if cex is not None:
            lines.append(f"   counterexample: {_clip(_compact(cex), max_counterexample_chars)}")
    if patch:
        lines.append(PATCH_REQUEST)
    elif previous_shown:
        lines.append("Write a corrected answer that passes every check above, in the same "
                      "form as before.")
    else:
        lines.append("Write an answer that passes every check above.")
    return "\n".join(lines)


class ChatGenerator:
    """The callable that :func:`chat_generator` returns (see there).

    ``gen(prompt, previous=None, feedback=())`` sends one chat completion request and returns
    an ``incr.Candidate``; ``gen.messages(prompt, previous, feedback)`` returns the messages
    it would send; ``gen.client`` is the ``openai.OpenAI`` client it uses;
    ``gen.fingerprint`` is a short hash of the model and everything sent besides the
    prompt, for an ``@incr.llm`` node's ``version``; ``gen.patch`` says whether a retry asks
    for a diff (patch mode, see the module's docstring).
    """

    def __init__(self, client: Any, model: str, *, system: str | None, temperature: float | None,
                 max_tokens: int | None, price_per_token, parse: Callable[[str], Any] | None,
                 render: Callable[..., str] | None, max_counterexample_chars: int | None,
                 create_kwargs: dict, patch: bool = False):
        self.client = client
        self.model = model
        self.system = system
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.price_per_token = price_per_token
        self.parse = parse
        self.render = render
        self.max_counterexample_chars = max_counterexample_chars
        self.create_kwargs = dict(create_kwargs)
        self.patch = patch

    @property
    def fingerprint(self) -> str:
        """A short hash of the model, the system message, the sampling settings, the extra
        request arguments and the renderer/parser names: put it in the node's ``version`` so
        that changing any of them does not reuse stored candidates."""
        parts = [self.model, self.system, self.temperature, self.max_tokens,
                 sorted((k, repr(v)) for k, v in self.create_kwargs.items()),
                 getattr(self.parse, "__qualname__", repr(self.parse)),
                 getattr(self.render, "__qualname__", repr(self.render)),
                 self.max_counterexample_chars]
        if self.patch:      # only then: the fingerprints of generators without it stay
            parts.append("patch")
        return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]

    def _patches(self, previous: Any, patch: bool | None) -> bool:
        return (self.patch if patch is None else patch) and isinstance(previous, str)

    def messages(self, prompt: str | Sequence[dict], previous: Any = None,
                 feedback: Iterable[Any] = (), *, patch: bool | None = None) -> list[dict]:
        """The messages one call with these arguments sends (in patch mode, the first call:
        the one that asks for a diff; ``patch=False`` gives the full-answer request it falls
        back to). ``prompt`` is the user's text, or a list of chat messages (dicts) that
        stands for it."""
        patch = self._patches(previous, patch)
        out: list[dict] = []
        if self.system is not None:
            out.append({"role": "system", "content": self.system})
        feedback = tuple(feedback)
        if previous is None and feedback:
            # feedback without the candidate it judged: said with the prompt, in the same
            # user turn (some chat templates refuse two user messages in a row)
            text = (self.render(feedback) if self.render is not None
                    else render_feedback(feedback, self.max_counterexample_chars,
                                         previous_shown=False))
            if isinstance(prompt, str):
                prompt = f"{prompt}\n\n{text}"
            else:
                prompt = [*prompt, {"role": "user", "content": text}]
        if isinstance(prompt, str):
            out.append({"role": "user", "content": prompt})
        else:
            out.extend(dict(m) for m in prompt)
        if previous is not None:
            if self.render is not None:
                text = self.render(feedback)
                if patch:
                    text = f"{text}\n\n{PATCH_REQUEST}"
            else:
                text = render_feedback(feedback, self.max_counterexample_chars, patch=patch)
            out.append({"role": "assistant", "content": _as_text(previous)})
            out.append({"role": "user", "content": text})
        return out

    def request(self, prompt: str | Sequence[dict], previous: Any = None,
                feedback: Iterable[Any] = (), *, patch: bool | None = None) -> dict:
        """The keyword arguments given to ``client.chat.completions.create`` (``patch``: as
        for :meth:`messages`)."""
        kw: dict = {"model": self.model,
                    "messages": self.messages(prompt, previous, feedback, patch=patch)}
        if self.temperature is not None:
            kw["temperature"] = self.temperature
        if self.max_tokens is not None:
            kw["max_tokens"] = self.max_tokens
        kw.update(self.create_kwargs)
        return kw

    def __call__(self, prompt: str | Sequence[dict], *, previous: Any = None,
                 feedback: Iterable[Any] = ()) -> Candidate:
        # Exceptions of the SDK pass through untouched: incr reads their class name and
        # status_code to tell a transient failure (retried) from a real one (raised).
        plan = self._plan(prompt, previous, feedback)
        kw = next(plan)
        while True:
            response = self.client.chat.completions.create(**kw)
            if inspect.isawaitable(response):
                if inspect.iscoroutine(response):
                    response.close()        # never awaited, and no "never awaited" warning
                raise TypeError(f"incr.openai_chat: {type(self.client).__qualname__}."
                                f"chat.completions.create returned an awaitable from a sync "
                                f"generator; pass an openai.AsyncOpenAI client to "
                                f"chat_generator to get an async generator, or use an "
                                f"openai.OpenAI client")
            try:
                kw = plan.send(response)
            except StopIteration as done:
                return done.value

    def _plan(self, prompt: str | Sequence[dict], previous: Any,
              feedback: Iterable[Any]) -> Generator[dict, Any, Candidate]:
        """One generator call, as the requests it makes: yields each request's keyword
        arguments, is sent the response, returns the candidate. The sync and the async
        ``__call__`` drive it, so both behave the same."""
        feedback = tuple(feedback)
        if not self._patches(previous, None):
            return self._candidate((yield self.request(prompt, previous, feedback)))
        response = yield self.request(prompt, previous, feedback, patch=True)
        tokens, cost = self._usage(getattr(response, "usage", None))
        out = self._patched(previous, response, tokens, cost)
        if out is not None:
            return out
        # no diff, or one that does not apply: ask for the whole answer, as without patch mode
        full = self._candidate((yield self.request(prompt, previous, feedback, patch=False)))
        return Candidate(full.value, tokens=full.tokens + tokens, cost=full.cost + cost)

    def _patched(self, previous: str, response: Any, tokens: int,
                 cost: float) -> Candidate | None:
        """The candidate a patch-mode reply makes: ``previous`` with the reply's diff applied;
        ``None`` when the reply has no text, was cut short, holds no diff or one that does
        not apply strictly."""
        choice = response.choices[0] if response.choices else None
        text = None if choice is None else choice.message.content
        if not text or getattr(choice, "finish_reason", None) == "length":
            return None
        try:
            diff, rationale = split_reply(text)
            if diff is None or not diff.strip():
                return None
            value = apply_patch(previous, diff, complete=True)     # not cut short
        except PatchError:
            return None
        return Candidate(value, tokens=tokens, cost=cost, rationale=rationale, patch=diff)

    def _candidate(self, response: Any) -> Candidate:
        if not response.choices:
            raise ValueError(f"incr.openai_chat: {self.model} returned no choices")
        choice = response.choices[0]
        text = choice.message.content
        if text is None:
            text = getattr(choice.message, "refusal", None)
        if text is None:
            raise ValueError(f"incr.openai_chat: {self.model} returned no text "
                             f"(finish_reason={choice.finish_reason!r})")
        tokens, cost = self._usage(getattr(response, "usage", None))
        value = self.parse(text) if self.parse is not None else text
        return Candidate(value, tokens=tokens, cost=cost)

    def _usage(self, usage: Any) -> tuple[int, float]:
        if usage is None:           # some servers do not report it: nothing is counted
            return 0, 0.0
        prompt = getattr(usage, "prompt_tokens", None) or 0
        completion = getattr(usage, "completion_tokens", None) or 0
        total = getattr(usage, "total_tokens", None) or (prompt + completion)
        price = self.price_per_token
        if price is None:
            return total, 0.0
        if isinstance(price, (int, float)):
            return total, total * float(price)
        p_in, p_out = price
        return total, prompt * float(p_in) + completion * float(p_out)

    def __repr__(self):
        return f"<incr.openai_chat generator {self.model!r} {self.fingerprint}>"


class AsyncChatGenerator(ChatGenerator):
    """:class:`ChatGenerator` over an async client (``openai.AsyncOpenAI``): an async
    generator. Under ``await`` (an async cell, ``rt.astabilize()``) independent nodes' calls run
    as concurrent tasks on the running loop; from sync code, on a loop incr keeps."""

    async def __call__(self, prompt: str | Sequence[dict], *, previous: Any = None,
                       feedback: Iterable[Any] = ()) -> Candidate:
        plan = self._plan(prompt, previous, feedback)
        kw = next(plan)
        while True:
            response = await self.client.chat.completions.create(**kw)
            try:
                kw = plan.send(response)
            except StopIteration as done:
                return done.value

    def __repr__(self):
        return f"<incr.openai_chat async generator {self.model!r} {self.fingerprint}>"


def _async_client(client: Any) -> bool:
    """True for a client whose ``chat.completions.create`` must be awaited: the SDK's
    ``openai.AsyncOpenAI`` / ``openai.AsyncAzureOpenAI``, or any client whose ``create`` is a
    coroutine function."""
    kind = None
    openai = sys.modules.get("openai")
    if openai is not None:
        for name in ("AsyncAzureOpenAI", "AsyncOpenAI"):    # the subclass first
            cls = getattr(openai, name, None)
            if isinstance(cls, type) and isinstance(client, cls):
                kind = f"an openai.{name} client"
                break
    if kind is None:
        try:
            create = client.chat.completions.create
        except Exception:
            create = None
        if create is not None and (inspect.iscoroutinefunction(create) or
                                   inspect.iscoroutinefunction(
                                       getattr(type(create), "__call__", None))):
            kind = f"a client whose chat.completions.create is async ({type(client).__name__})"
    return kind is not None


def chat_generator(model: str, *, system: str | None = None, base_url: str | None = None,
                   api_key: str | None = None, client: Any = None,
                   temperature: float | None = 0.0, max_tokens: int | None = None,
                   price_per_token: float | tuple[float, float] | None = None,
                   parse: Callable[[str], Any] | None = None,
                   render: Callable[[tuple], str] | None = None,
                   max_counterexample_chars: int | None = 4000,
                   timeout: float | None = None, max_retries: int | None = None,
                   client_kwargs: dict | None = None, asynchronous: bool = False,
                   patch: bool = False, **create_kwargs: Any) -> ChatGenerator:
    """A generator for an ``@incr.llm`` node, backed by an OpenAI-compatible chat endpoint.

    - ``model``: the model name the server knows (``"gpt-4o-mini"``, ``"qwen2.5:7b"``, ...).
    - ``system``: the system message, sent first on every call (none if ``None``).
    - ``base_url``: the server, e.g. ``"http://localhost:8080/v1"`` for llama.cpp; default:
      the SDK's (``OPENAI_BASE_URL``, else OpenAI). ``api_key``: default: the SDK's
      (``OPENAI_API_KEY``); with a ``base_url`` and no key at all, a placeholder is sent.
    - ``client``: an ``openai.OpenAI`` client to use instead of making one, or an
      ``openai.AsyncOpenAI`` one: then the generator is async (:class:`AsyncChatGenerator`:
      under ``await``, independent nodes call the model concurrently as tasks) (then
      ``base_url``, ``api_key``, ``timeout``, ``max_retries`` and ``client_kwargs`` must not
      be given).
    - ``timeout``, ``max_retries``: passed to the client made here; ``None`` leaves the
      SDK's defaults (the SDK retries 408/409/429/5xx and connection errors itself first).
    - ``client_kwargs``: any other arguments of ``openai.OpenAI(...)`` (``default_headers``,
      ``organization``, ``http_client``, ...).
    - ``asynchronous``: make an ``openai.AsyncOpenAI`` client (an async generator).
    - ``temperature`` (default 0.0; ``None`` sends none, for models that refuse it),
      ``max_tokens`` (sent as ``max_tokens`` when given) and any other keyword argument
      (``seed=``, ``stop=``, ``response_format=``, ``max_completion_tokens=``, ...) go into
      every ``chat.completions.create`` call as they are.
    - ``price_per_token``: a number per token, or ``(per prompt token, per completion
      token)``; with it, each candidate reports ``cost`` (for ``incr.Budget(max_cost=)``).
    - ``parse``: ``text -> value``, applied to the reply; the value is the candidate. What it
      raises reaches the caller (the node fails), so a parser that may meet bad text should
      return something the validators NACK instead.
    - ``render``: ``feedback -> str``, the user message sent after the previous candidate;
      default :func:`render_feedback` (counterexamples clipped at
      ``max_counterexample_chars``; ``None``: not clipped).
    - ``patch``: patch mode. A retry whose ``previous`` is a string asks for a minimal edit
      of it as a unified diff (one fenced block) and applies it strictly
      (:func:`incr.patches.apply_patch`); the candidate is the patched text (``parse`` is not
      applied to it: ``previous`` is already a candidate) with ``patch=`` the diff and
      ``rationale=`` the words outside the block. No diff, a diff that does not apply or a
      reply cut short: one more call asks for the full answer (``patch=None``; tokens and cost
      of both calls). The first attempt (``previous=None``) always asks for a full answer.

    Raises ``ImportError`` (saying what to install) when ``openai`` is not installed.
    """
    if not isinstance(model, str) or not model:
        raise TypeError(f"chat_generator: model must be a non-empty string, got {model!r}")
    if price_per_token is not None and not isinstance(price_per_token, (int, float)):
        try:
            p_in, p_out = price_per_token
            float(p_in), float(p_out)
        except (TypeError, ValueError):
            raise TypeError("chat_generator: price_per_token must be a number or a pair "
                            f"(prompt, completion), got {price_per_token!r}") from None
    if not isinstance(patch, bool):
        raise TypeError(f"chat_generator: patch must be True or False, got {patch!r}")
    for name, fn in (("parse", parse), ("render", render)):
        if fn is not None and not callable(fn):
            raise TypeError(f"chat_generator: {name} must be callable, got {fn!r}")
    if client is None:
        openai = _import_openai()
        kw: dict = dict(client_kwargs or {})
        for name, v in (("base_url", base_url), ("api_key", api_key), ("timeout", timeout),
                        ("max_retries", max_retries)):
            if v is not None and name in kw:
                raise TypeError(f"chat_generator: {name} is given twice (as an argument "
                                "and in client_kwargs)")
        if "base_url" in kw:
            base_url = kw.pop("base_url")
        if "api_key" in kw:
            api_key = kw.pop("api_key")
        if base_url is not None:
            kw["base_url"] = base_url
            if api_key is None and not os.environ.get("OPENAI_API_KEY"):
                api_key = LOCAL_API_KEY
        if api_key is not None:
            kw["api_key"] = api_key
        if timeout is not None:
            kw["timeout"] = timeout
        if max_retries is not None:
            kw["max_retries"] = max_retries
        client = (openai.AsyncOpenAI if asynchronous else openai.OpenAI)(**kw)
    else:
        asynchronous = _async_client(client)
        given = [n for n, v in (("base_url", base_url), ("api_key", api_key),
                                ("timeout", timeout), ("max_retries", max_retries),
                                ("client_kwargs", client_kwargs))
                 if v is not None]
        if given:
            raise TypeError(f"chat_generator: {', '.join(given)} configure the client this "
                            "function makes; with client= set them on that client instead")
    cls = AsyncChatGenerator if asynchronous else ChatGenerator
    return cls(client, model, system=system, temperature=temperature,
                         max_tokens=max_tokens, price_per_token=price_per_token, parse=parse,
                         render=render, max_counterexample_chars=max_counterexample_chars,
                         create_kwargs=create_kwargs, patch=patch)
