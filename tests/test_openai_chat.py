"""incr.openai_chat: the requests it sends and what it makes of the answers, seen through the
official SDK's own transport hook (an HTTP client with a mock transport). No network."""

from __future__ import annotations

import json
import sys

import pytest

import incr
from incr import openai_chat
from incr.llmnodes import _transient

SYSTEM = "You write SQLite SQL. Reply with SQL only."


@pytest.fixture
def sdk():
    return pytest.importorskip("openai")


@pytest.fixture
def http(sdk):
    """The HTTP library this openai release is built on: httpx up to openai 2, httpx2 from
    openai 3 (told by the base class of the SDK's own default HTTP client)."""
    name = "httpx"
    for cls in getattr(getattr(sdk, "DefaultHttpxClient", None), "__mro__", ())[1:]:
        if cls.__module__.split(".")[0].startswith("httpx"):
            name = cls.__module__.split(".")[0]
            break
    return pytest.importorskip(name)


def completion(text, prompt_tokens=11, completion_tokens=7, usage=True):
    body = {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 1700000000,
        "model": "test-model",
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "content": text}}],
    }
    if usage:
        body["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                         "total_tokens": prompt_tokens + completion_tokens}
    return body


class Server:
    """A canned chat-completions server behind a mock transport: answers in order (the last
    repeats), each ``(status, json body)``, a completion's json body or its text; records
    every request."""

    def __init__(self, http, *answers):
        self.http = http
        self.answers = list(answers)
        self.requests = []

    def __call__(self, request):
        self.requests.append(request)
        a = self.answers[min(len(self.requests), len(self.answers)) - 1]
        if isinstance(a, tuple):
            status, body = a
        else:
            status, body = 200, a if isinstance(a, dict) else completion(a)
        return self.http.Response(status, json=body)

    @property
    def bodies(self):
        return [json.loads(r.content) for r in self.requests]

    def http_client(self):
        return self.http.Client(transport=self.http.MockTransport(self))

    def client(self, sdk, base_url="https://api.test/v1"):
        # max_retries=0: the SDK must not retry by itself, so every request is seen here
        return sdk.OpenAI(api_key="sk-test", base_url=base_url, max_retries=0,
                          http_client=self.http_client())


# --- the request -----------------------------------------------------------------------------


def test_first_call_sends_system_and_prompt(sdk, http):
    srv = Server(http, "SELECT 1;")
    gen = openai_chat.chat_generator("gpt-4o-mini", system=SYSTEM, client=srv.client(sdk))
    out = gen("Write SQL for: count paid orders")
    assert out == incr.Candidate("SELECT 1;", tokens=18, cost=0.0)
    (req,) = srv.requests
    assert req.method == "POST"
    assert str(req.url) == "https://api.test/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-test"
    assert srv.bodies[0] == {
        "model": "gpt-4o-mini",
        "messages": [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": "Write SQL for: count paid orders"}],
        "temperature": 0.0,
    }


def test_feedback_is_rendered_after_the_previous_candidate(sdk, http):
    srv = Server(http, "SELECT 2;")
    gen = openai_chat.chat_generator("m", system=SYSTEM, client=srv.client(sdk))
    feedback = (
        incr.NACK("paid_not_refunded", counterexample={"rows": [[1, "paid"]], "expected": 1,
                                                       "got": 0}, message="wrong count"),
        incr.NACK("no_set_in_json", counterexample={1, 2}),     # not JSON: its repr
        incr.NACK("bare"),
    )
    gen("Write SQL for: count", previous="SELECT 1;", feedback=feedback)
    msgs = srv.bodies[0]["messages"]
    assert msgs[:3] == [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": "Write SQL for: count"},
                        {"role": "assistant", "content": "SELECT 1;"}]
    assert msgs[3] == {"role": "user", "content": (
        "That answer was rejected by these checks:\n"
        "1. case paid_not_refunded: wrong count\n"
        '   counterexample: {"rows":[[1,"paid"]],"expected":1,"got":0}\n'
        "2. case no_set_in_json\n"
        "   counterexample: {1, 2}\n"
        "3. case bare\n"
        "Write a corrected answer that passes every check above, in the same form as before.")}
    assert len(msgs) == 4
    assert msgs == gen.messages("Write SQL for: count", "SELECT 1;", feedback)


def test_previous_without_feedback_and_non_text_previous(sdk, http):
    srv = Server(http, '{"a": 2}')
    gen = openai_chat.chat_generator("m", client=srv.client(sdk), parse=json.loads)
    out = gen("give json", previous={"a": 1})
    assert out.value == {"a": 2}
    assert srv.bodies[0]["messages"] == [
        {"role": "user", "content": "give json"},
        {"role": "assistant", "content": '{"a":1}'},
        {"role": "user", "content": "That answer was not accepted. Write a corrected answer, "
                                    "in the same form as before."}]


def test_feedback_without_previous_is_not_dropped(sdk, http):
    srv = Server(http, "x")
    gen = openai_chat.chat_generator("m", system=SYSTEM, client=srv.client(sdk))
    fb = (incr.NACK("refunds", counterexample={"got": 2}, message="exclude refunds"),)
    gen("Write SQL", feedback=fb)
    gen([{"role": "user", "content": "Write SQL"}], feedback=fb)
    text = ("An earlier answer was rejected by these checks:\n"
            "1. case refunds: exclude refunds\n"
            '   counterexample: {"got":2}\n'
            "Write an answer that passes every check above.")
    assert srv.bodies[0]["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Write SQL\n\n" + text}]
    assert srv.bodies[1]["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Write SQL"},
        {"role": "user", "content": text}]


def test_long_counterexamples_are_clipped_and_render_can_be_replaced(sdk, http):
    srv = Server(http, "x")
    gen = openai_chat.chat_generator("m", client=srv.client(sdk), max_counterexample_chars=10)
    gen("p", previous="y", feedback=(incr.NACK("c", counterexample="z" * 50),))
    assert ('counterexample: "zzzzzzzzz... (42 more characters not shown)'
            in srv.bodies[0]["messages"][-1]["content"])
    gen2 = openai_chat.chat_generator(
        "m", client=srv.client(sdk), render=lambda fb: "fix: " + ",".join(v.case for v in fb))
    gen2("p", previous="y", feedback=(incr.NACK("a"), incr.NACK("b")))
    assert srv.bodies[1]["messages"][-1] == {"role": "user", "content": "fix: a,b"}


def test_sampling_settings_and_extra_arguments_are_sent_as_given(sdk, http):
    srv = Server(http, "x")
    gen = openai_chat.chat_generator("m", client=srv.client(sdk), temperature=None,
                                     max_tokens=64, top_p=0.5, stop=["\n\n"])
    gen([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
         {"role": "user", "content": "c"}])
    assert srv.bodies[0] == {"model": "m", "max_tokens": 64, "top_p": 0.5, "stop": ["\n\n"],
                             "messages": [{"role": "user", "content": "a"},
                                          {"role": "assistant", "content": "b"},
                                          {"role": "user", "content": "c"}]}
    assert "temperature" not in srv.bodies[0]


def test_fingerprint_follows_what_is_sent(sdk, http):
    c = Server(http).client(sdk)
    fp = openai_chat.chat_generator("m", system="s", client=c).fingerprint
    assert fp == openai_chat.chat_generator("m", system="s", client=c).fingerprint
    assert fp != openai_chat.chat_generator("m", system="t", client=c).fingerprint
    assert fp != openai_chat.chat_generator("m2", system="s", client=c).fingerprint
    assert fp != openai_chat.chat_generator("m", system="s", client=c, top_p=0.5).fingerprint


# --- the client it makes ---------------------------------------------------------------------


def test_base_url_is_honoured_and_a_local_server_needs_no_key(sdk, http, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    srv = Server(http, "ok")
    gen = openai_chat.chat_generator("qwen2.5:7b", base_url="http://localhost:8080/v1",
                                     max_retries=0, timeout=5.0,
                                     client_kwargs={"http_client": srv.http_client()})
    assert isinstance(gen.client, sdk.OpenAI)
    assert gen.client.max_retries == 0
    assert gen("hi").value == "ok"
    (req,) = srv.requests
    assert str(req.url) == "http://localhost:8080/v1/chat/completions"
    assert req.headers["authorization"] == f"Bearer {openai_chat.LOCAL_API_KEY}"


def test_an_explicit_key_is_sent(sdk, http, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    srv = Server(http, "ok")
    gen = openai_chat.chat_generator("m", base_url="http://127.0.0.1:11434/v1", api_key="k1",
                                     client_kwargs={"http_client": srv.http_client()})
    gen("hi")
    assert str(srv.requests[0].url) == "http://127.0.0.1:11434/v1/chat/completions"
    assert srv.requests[0].headers["authorization"] == "Bearer k1"


def test_bad_arguments(sdk, http):
    c = Server(http).client(sdk)
    with pytest.raises(TypeError, match="base_url"):
        openai_chat.chat_generator("m", client=c, base_url="http://x/v1")
    with pytest.raises(TypeError, match="model"):
        openai_chat.chat_generator("", client=c)
    with pytest.raises(TypeError, match="price_per_token"):
        openai_chat.chat_generator("m", client=c, price_per_token="cheap")
    with pytest.raises(TypeError, match="parse"):
        openai_chat.chat_generator("m", client=c, parse="json")
    with pytest.raises(TypeError, match="twice"):
        openai_chat.chat_generator("m", base_url="http://x/v1",
                                   client_kwargs={"base_url": "http://y/v1"})


def test_without_openai_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "openai", None)      # `import openai` now fails
    with pytest.raises(ImportError, match=r"pip install 'incr\[openai\]'"):
        openai_chat.chat_generator("m")


# --- the answer ------------------------------------------------------------------------------


def test_tokens_and_cost(sdk, http):
    srv = Server(http, completion("a", prompt_tokens=100, completion_tokens=10))
    c = srv.client(sdk)
    assert openai_chat.chat_generator("m", client=c)("p") == incr.Candidate("a", tokens=110)
    out = openai_chat.chat_generator("m", client=c, price_per_token=0.5)("p")
    assert (out.tokens, out.cost) == (110, 55.0)
    out = openai_chat.chat_generator("m", client=c, price_per_token=(1e-6, 4e-6))("p")
    assert out.tokens == 110 and out.cost == pytest.approx(100e-6 + 40e-6)


def test_no_usage_reported_counts_nothing(sdk, http):
    srv = Server(http, completion("a", usage=False))
    gen = openai_chat.chat_generator("m", client=srv.client(sdk), price_per_token=1.0)
    assert gen("p") == incr.Candidate("a", tokens=0, cost=0.0)


def test_no_text_is_an_error_not_an_empty_candidate(sdk, http):
    body = completion(None)
    body["choices"][0]["finish_reason"] = "tool_calls"
    srv = Server(http, body)
    gen = openai_chat.chat_generator("m", client=srv.client(sdk))
    with pytest.raises(ValueError, match="no text.*tool_calls"):
        gen("p")


# --- errors: kept as the SDK raises them -----------------------------------------------------


RATE_LIMITED = (429, {"error": {"message": "Rate limit reached", "type": "requests",
                                "code": "rate_limit_exceeded"}})
BAD_KEY = (401, {"error": {"message": "Incorrect API key", "type": "invalid_request_error",
                           "code": "invalid_api_key"}})


def test_a_429_surfaces_as_the_sdks_rate_limit_error(sdk, http):
    srv = Server(http, RATE_LIMITED)
    gen = openai_chat.chat_generator("m", client=srv.client(sdk))
    with pytest.raises(sdk.RateLimitError) as info:
        gen("p")
    assert info.value.status_code == 429
    assert _transient(info.value), "incr must see it as transient"
    assert len(srv.requests) == 1, "max_retries=0: the SDK did not retry"


def test_a_node_retries_a_rate_limit_then_accepts(sdk, http, rt):
    srv = Server(http, RATE_LIMITED, RATE_LIMITED, "SELECT 1;")
    gen = openai_chat.chat_generator("m", client=srv.client(sdk))

    @incr.llm(version="t")
    def write_sql(request: str, *, previous=None, feedback=()):
        return gen(f"Write SQL for: {request}", previous=previous, feedback=feedback)

    write_sql.backoff = 0.001
    with rt:
        assert write_sql("count") == "SELECT 1;"
    assert len(srv.requests) == 3
    assert srv.bodies[0] == srv.bodies[2], "a retry after a rate limit is the same request"
    assert "previous" not in json.dumps(srv.bodies[2]) and len(srv.bodies[2]["messages"]) == 1
    st = rt.state(write_sql, "count")
    assert (st.status, st.revision) == ("unvalidated", 1)


def test_a_node_lets_a_real_error_through_unretried(sdk, http, rt):
    srv = Server(http, BAD_KEY, "never")
    gen = openai_chat.chat_generator("m", client=srv.client(sdk))

    @incr.llm(version="t")
    def write_sql(request: str, *, previous=None, feedback=()):
        return gen(request, previous=previous, feedback=feedback)

    write_sql.backoff = 0.001
    with rt, pytest.raises(sdk.AuthenticationError):
        write_sql("count")
    assert len(srv.requests) == 1


# --- end to end: a NACKed answer, then the feedback in the next request ---------------------


def test_end_to_end_nack_then_feedback_then_accept(sdk, http, rt):
    srv = Server(http, completion("SELECT count(*) FROM orders;", 20, 5),
                 completion("SELECT count(*) FROM orders WHERE status = 'paid';", 60, 9))
    gen = openai_chat.chat_generator("gpt-4o-mini", system=SYSTEM, client=srv.client(sdk))
    seen = []

    @incr.validator(version="1")
    def filters_paid(candidate: str, request: str):
        seen.append(candidate)
        if "'paid'" in candidate:
            return incr.ACK("paid_only")
        return incr.NACK("paid_only", message="counts refunded orders too",
                         counterexample={"rows": [[1, "paid"], [2, "refunded"]],
                                         "expected": 1, "got": 2})

    @incr.llm(validators=[filters_paid], budget=incr.Budget(max_attempts=3, max_tokens=1000),
              version=f"prompt-v1/{gen.fingerprint}")
    def write_sql(request: str, *, previous=None, feedback=()):
        return gen(f"Write SQL for: {request}", previous=previous, feedback=feedback)

    with rt:
        assert write_sql("count paid orders") == \
            "SELECT count(*) FROM orders WHERE status = 'paid';"
    assert len(srv.requests) == 2 and len(seen) == 2
    first, second = srv.bodies
    assert first["messages"] == [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": "Write SQL for: count paid orders"}]
    assert second["messages"][:3] == first["messages"] + [
        {"role": "assistant", "content": "SELECT count(*) FROM orders;"}]
    assert second["messages"][3]["role"] == "user"
    fb = second["messages"][3]["content"]
    assert "1. case paid_only: counts refunded orders too\n" in fb
    assert '   counterexample: {"rows":[[1,"paid"],[2,"refunded"]],"expected":1,"got":2}' in fb
    st = rt.state(write_sql, "count paid orders")
    assert (st.status, st.revision) == ("stable", 2)
    # PASS path: asked again, nothing is sent
    with rt:
        write_sql("count paid orders")
    assert len(srv.requests) == 2


def test_token_budget_counts_what_the_server_reported(sdk, http, rt):
    srv = Server(http, *[completion(f"nope {i}", 400, 200) for i in range(5)])
    gen = openai_chat.chat_generator("m", client=srv.client(sdk))

    @incr.validator(version="1")
    def never(candidate: str, request: str):
        return incr.NACK("never", counterexample={"n": len(srv.requests)})

    @incr.llm(validators=[never], budget=incr.Budget(max_attempts=10, max_tokens=1000),
              version="t")
    def write_sql(request: str, *, previous=None, feedback=()):
        return gen(request, previous=previous, feedback=feedback)

    with rt, pytest.raises(incr.NotAccepted) as info:
        write_sql("x")
    # 600 tokens per call: the budget of 1000 is spent after the second call
    assert info.value.reason == "budget"
    assert len(srv.requests) == 2
    assert "1200 tokens" in info.value.report


# --- the async client ------------------------------------------------------------------------


def test_an_async_client_makes_concurrent_model_calls_through_the_sdk_transport(sdk, http):
    """AsyncOpenAI, through the SDK's own async transport hook: five nodes under
    asyncio.gather are in flight at once (the transport only answers when all five wait)."""
    import asyncio

    n = 5
    state = {"waiting": 0, "event": None}
    requests = []

    async def handler(request):
        body = json.loads(request.content)
        requests.append(body)
        if state["event"] is None:
            state["event"] = asyncio.Event()
        state["waiting"] += 1
        if state["waiting"] >= n:
            state["event"].set()
        await asyncio.wait_for(state["event"].wait(), 5)
        return http.Response(200, json=completion(f"SELECT {body['messages'][-1]['content']}"))

    client = sdk.AsyncOpenAI(api_key="sk-test", base_url="https://api.test/v1", max_retries=0,
                             http_client=http.AsyncClient(transport=http.MockTransport(handler)))
    gen = openai_chat.chat_generator("test-model", system=SYSTEM, client=client)

    @incr.llm(version=gen.fingerprint)
    async def sql(q, *, previous=None, feedback=()):
        return await gen(q, previous=previous, feedback=feedback)

    @incr.cell
    async def all_sql():
        return list(await asyncio.gather(*[sql(f"q{i}") for i in range(n)]))

    async def main():
        rt = incr.Runtime()
        with rt:
            out = await all_sql()
            assert out == [f"SELECT q{i}" for i in range(n)]
            assert rt.stats()["generations"] == n
            assert rt._check()
            rt._check()

    asyncio.run(main())
    assert len(requests) == n
    assert all(r["messages"][0] == {"role": "system", "content": SYSTEM} for r in requests)
