"""chat_generator(patch=True): a retry asks for a unified diff of the previous answer, applies it
strictly, and falls back to asking for the full answer. Seen through the official SDK's own
transport hook (an HTTP client with a mock transport), as in test_openai_chat.py. No network."""

from __future__ import annotations

import asyncio
import json

import pytest

import incr
from incr import openai_chat
from incr.patches import make_patch

SYSTEM = "You write SQLite SQL. Reply with SQL only."
PROMPT = "Write SQL for: count paid orders per day"
OLD = "SELECT day, count(*)\nFROM orders\nGROUP BY day;"
NEW = "SELECT day, count(*)\nFROM orders\nWHERE status = 'paid'\nGROUP BY day;"
FEEDBACK = (incr.NACK("paid_only", message="counts refunded orders too",
                      counterexample={"rows": [[1, "paid"], [2, "refunded"]], "got": 2}),)
GOOD = ("The query counted every order; keep the paid ones only.\n\n```diff\n"
        "--- a\n+++ b\n@@ -1,3 +1,4 @@\n SELECT day, count(*)\n FROM orders\n"
        "+WHERE status = 'paid'\n GROUP BY day;\n```")
GOOD_DIFF = ("--- a\n+++ b\n@@ -1,3 +1,4 @@\n SELECT day, count(*)\n FROM orders\n"
             "+WHERE status = 'paid'\n GROUP BY day;\n")
# its context says "FROM payments": not the previous answer, so it must not apply
BAD = ("```diff\n@@ -1,3 +1,4 @@\n SELECT day, count(*)\n FROM payments\n+WHERE paid\n"
       " GROUP BY day;\n```")


@pytest.fixture
def sdk():
    return pytest.importorskip("openai")


@pytest.fixture
def http(sdk):
    """The HTTP library this openai release is built on (httpx, or httpx2 from openai 3)."""
    name = "httpx"
    for cls in getattr(getattr(sdk, "DefaultHttpxClient", None), "__mro__", ())[1:]:
        if cls.__module__.split(".")[0].startswith("httpx"):
            name = cls.__module__.split(".")[0]
            break
    return pytest.importorskip(name)


def completion(text, prompt_tokens=11, completion_tokens=7, finish_reason="stop"):
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": 1700000000,
            "model": "test-model",
            "choices": [{"index": 0, "finish_reason": finish_reason, "logprobs": None,
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


class Server:
    """Canned completions in order (the last repeats), each a text or a json body; records
    every request."""

    def __init__(self, http, *answers):
        self.http = http
        self.answers = list(answers)
        self.requests = []

    def __call__(self, request):
        self.requests.append(request)
        a = self.answers[min(len(self.requests), len(self.answers)) - 1]
        return self.http.Response(200, json=a if isinstance(a, dict) else completion(a))

    @property
    def bodies(self):
        return [json.loads(r.content) for r in self.requests]

    def client(self, sdk):
        return sdk.OpenAI(api_key="sk-test", base_url="https://api.test/v1", max_retries=0,
                          http_client=self.http.Client(transport=self.http.MockTransport(self)))

    def async_client(self, sdk):
        return sdk.AsyncOpenAI(
            api_key="sk-test", base_url="https://api.test/v1", max_retries=0,
            http_client=self.http.AsyncClient(transport=self.http.MockTransport(self)))


def full_answer_messages():
    """The messages of a retry without patch mode: what the fallback sends."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT},
            {"role": "assistant", "content": OLD},
            {"role": "user", "content": openai_chat.render_feedback(FEEDBACK)}]


# --- the first attempt -----------------------------------------------------------------------


def test_the_first_attempt_asks_for_a_full_answer(sdk, http):
    srv = Server(http, OLD)
    gen = openai_chat.chat_generator("m", system=SYSTEM, client=srv.client(sdk), patch=True)
    out = gen(PROMPT)
    assert out == incr.Candidate(OLD, tokens=18)
    assert out.patch is None and out.rationale == ""
    assert srv.bodies == [{"model": "m", "temperature": 0.0,
                           "messages": [{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": PROMPT}]}]


# --- a retry ---------------------------------------------------------------------------------


def test_a_retry_with_a_good_diff_makes_one_call_and_returns_the_patched_text(sdk, http):
    srv = Server(http, completion(GOOD, 100, 20))
    gen = openai_chat.chat_generator("m", system=SYSTEM, client=srv.client(sdk), patch=True,
                                     price_per_token=0.01)
    out = gen(PROMPT, previous=OLD, feedback=FEEDBACK)
    assert len(srv.requests) == 1
    assert out.value == NEW                         # no newline at the end, like OLD
    assert out.patch == GOOD_DIFF
    assert out.rationale == "The query counted every order; keep the paid ones only."
    assert (out.tokens, out.cost) == (120, pytest.approx(1.2))
    # what was asked: the previous answer, the feedback, then a request for a diff
    msgs = srv.bodies[0]["messages"]
    assert msgs[:3] == full_answer_messages()[:3]
    assert msgs[3]["role"] == "user" and len(msgs) == 4
    assert msgs[3]["content"].startswith("That answer was rejected by these checks:\n"
                                         "1. case paid_only: counts refunded orders too\n")
    assert msgs[3]["content"].endswith(openai_chat.PATCH_REQUEST)
    assert "```diff" in openai_chat.PATCH_REQUEST and "unified diff" in openai_chat.PATCH_REQUEST
    assert msgs == gen.messages(PROMPT, OLD, FEEDBACK)


def test_a_miscounted_last_hunk_still_applies_when_the_reply_was_whole(sdk, http):
    # the header counts 6 and 7 lines, the hunk has 3 and 4: models miscount; the content
    # matches and the reply ended normally (finish_reason "stop", the fence closed)
    for body in (GOOD.replace("@@ -1,3 +1,4 @@", "@@ -1,6 +1,7 @@"),
                 GOOD_DIFF.replace("@@ -1,3 +1,4 @@", "@@ -1,6 +1,7 @@")):   # unfenced
        srv = Server(http, body)
        gen = openai_chat.chat_generator("m", client=srv.client(sdk), patch=True)
        out = gen(PROMPT, previous=OLD, feedback=FEEDBACK)
        assert (out.value, len(srv.requests)) == (NEW, 1)
        assert out.patch is not None


def test_a_diff_that_does_not_apply_falls_back_to_the_full_answer(sdk, http):
    srv = Server(http, completion(BAD, 100, 20), completion(NEW, 150, 30))
    gen = openai_chat.chat_generator("m", system=SYSTEM, client=srv.client(sdk), patch=True,
                                     price_per_token=0.01)
    out = gen(PROMPT, previous=OLD, feedback=iter(FEEDBACK))   # an iterator: read once
    assert len(srv.requests) == 2
    assert out.value == NEW and out.patch is None and out.rationale == ""
    assert (out.tokens, out.cost) == (300, pytest.approx(3.0)), "both calls are counted"
    first, second = srv.bodies
    assert first["messages"][-1]["content"].endswith(openai_chat.PATCH_REQUEST)
    assert second["messages"] == full_answer_messages()
    assert second == gen.request(PROMPT, OLD, FEEDBACK, patch=False)


@pytest.mark.parametrize("reply", [
    pytest.param(completion("Sure! Here is the corrected query:\n```sql\nSELECT 1;\n```"),
                 id="no-diff"),
    pytest.param(completion("```diff\n```"), id="empty-diff-block"),
    pytest.param(completion(GOOD[:-4] + "\n", finish_reason="length"), id="cut-short"),
    pytest.param(completion("```diff\n@@ -1 +1 @@\n-a\n+b\n```\n```diff\n@@ -2 +2 @@\n-c\n+d\n"
                            "```"), id="two-diff-blocks"),
    pytest.param(completion(None), id="no-text"),
])
def test_a_reply_without_a_usable_diff_falls_back(sdk, http, reply):
    srv = Server(http, reply, NEW)
    gen = openai_chat.chat_generator("m", system=SYSTEM, client=srv.client(sdk), patch=True)
    out = gen(PROMPT, previous=OLD, feedback=FEEDBACK)
    assert len(srv.requests) == 2
    assert out == incr.Candidate(NEW, tokens=36)
    assert srv.bodies[1]["messages"] == full_answer_messages()


def test_a_cut_short_reply_is_not_applied_even_when_its_diff_would(sdk, http):
    srv = Server(http, completion(GOOD, finish_reason="length"), NEW)
    gen = openai_chat.chat_generator("m", client=srv.client(sdk), patch=True)
    assert gen(PROMPT, previous=OLD).patch is None
    assert len(srv.requests) == 2


def test_without_patch_mode_or_with_a_non_text_previous_a_retry_asks_for_the_full_answer(
        sdk, http):
    srv = Server(http, NEW, '{"a": 2}')
    plain = openai_chat.chat_generator("m", system=SYSTEM, client=srv.client(sdk))
    assert plain(PROMPT, previous=OLD, feedback=FEEDBACK) == incr.Candidate(NEW, tokens=18)
    assert srv.bodies[0]["messages"] == full_answer_messages()
    gen = openai_chat.chat_generator("m", client=srv.client(sdk), patch=True, parse=json.loads)
    out = gen("give json", previous={"a": 1})
    assert out.value == {"a": 2} and out.patch is None
    assert "diff" not in srv.bodies[1]["messages"][-1]["content"]
    assert len(srv.requests) == 2


def test_a_custom_render_gets_the_patch_request_after_it(sdk, http):
    diff = make_patch(OLD, NEW)
    srv = Server(http, f"```diff\n{diff}```")
    gen = openai_chat.chat_generator("m", client=srv.client(sdk), patch=True,
                                     render=lambda fb: "fix: " + ",".join(v.case for v in fb))
    out = gen(PROMPT, previous=OLD, feedback=FEEDBACK)
    assert (out.value, out.patch, out.rationale) == (NEW, diff, "")
    assert srv.bodies[0]["messages"][-1]["content"] == \
        f"fix: paid_only\n\n{openai_chat.PATCH_REQUEST}"


def test_fingerprint_and_arguments(sdk, http):
    c = Server(http).client(sdk)
    plain = openai_chat.chat_generator("m", client=c)
    assert plain.patch is False
    patched = openai_chat.chat_generator("m", client=c, patch=True)
    assert patched.fingerprint != plain.fingerprint
    assert openai_chat.chat_generator("m", client=c, patch=False).fingerprint == \
        plain.fingerprint
    with pytest.raises(TypeError, match="patch must be True or False"):
        openai_chat.chat_generator("m", client=c, patch="yes")


# --- in a node -------------------------------------------------------------------------------


def test_a_node_accepts_a_patched_retry(sdk, http, rt):
    srv = Server(http, OLD, GOOD)
    gen = openai_chat.chat_generator("m", system=SYSTEM, client=srv.client(sdk), patch=True)
    seen = []

    @incr.validator(version="1")
    def paid_only(candidate: str, request: str):
        seen.append(candidate)
        if "'paid'" in candidate:
            return incr.ACK("paid_only")
        return FEEDBACK[0]

    @incr.llm(validators=[paid_only], budget=incr.Budget(max_attempts=3),
              version=f"v1/{gen.fingerprint}")
    def write_sql(request: str, *, previous=None, feedback=()):
        return gen(f"Write SQL for: {request}", previous=previous, feedback=feedback)

    with rt:
        assert write_sql("count paid orders per day") == NEW
    assert seen == [OLD, NEW]
    assert len(srv.requests) == 2
    assert srv.bodies[1]["messages"][-1]["content"].endswith(openai_chat.PATCH_REQUEST)
    st = rt.state(write_sql, "count paid orders per day")
    assert (st.status, st.revision) == ("stable", 2)


# --- the async generator ---------------------------------------------------------------------


def test_async_patch_mode(sdk, http):
    srv = Server(http, OLD, GOOD, BAD, NEW)
    gen = openai_chat.chat_generator("m", system=SYSTEM, client=srv.async_client(sdk),
                                     patch=True)
    assert isinstance(gen, openai_chat.AsyncChatGenerator)

    async def main():
        first = await gen(PROMPT)
        patched = await gen(PROMPT, previous=OLD, feedback=FEEDBACK)
        fell_back = await gen(PROMPT, previous=OLD, feedback=FEEDBACK)
        return first, patched, fell_back

    first, patched, fell_back = asyncio.run(main())
    assert (first.value, first.patch) == (OLD, None)
    assert (patched.value, patched.patch, patched.tokens) == (NEW, GOOD_DIFF, 18)
    assert (fell_back.value, fell_back.patch, fell_back.tokens) == (NEW, None, 36)
    assert len(srv.requests) == 4           # 1 + 1 + 2
    bodies = srv.bodies
    assert len(bodies[0]["messages"]) == 2
    assert bodies[1]["messages"][-1]["content"].endswith(openai_chat.PATCH_REQUEST)
    assert bodies[2]["messages"][-1]["content"].endswith(openai_chat.PATCH_REQUEST)
    assert bodies[3]["messages"] == full_answer_messages()
