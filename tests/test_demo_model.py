"""`incr demo --model openai:NAME --base-url URL` against a real HTTP server on localhost that
speaks the chat-completions protocol (canned answers; no network beyond the loopback)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

pytest.importorskip("openai")


class Chat(BaseHTTPRequestHandler):
    requests: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Chat.requests.append((self.path, body))
        text = json.dumps(body["messages"])
        if "into JSON" in text:
            answer = '{"measure": "count", "entity": "orders", "filters": ["paid", "not refunded"]}'
        elif "excludes_refunds" in text:
            answer = "SELECT COUNT(*) FROM orders WHERE status = 'paid' AND refunded = 0"
        else:
            answer = "```sql\nSELECT COUNT(*) FROM orders WHERE status = 'paid'\n```"
        out = json.dumps({
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": answer}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def test_demo_with_a_chat_endpoint(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), Chat)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1"
        out = subprocess.run(
            [sys.executable, "-m", "incr.cli", "demo", "--json", "--memory",
             "--model", "openai:test-model", "--base-url", url],
            capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
    finally:
        server.shutdown()
    assert result["model"] == f"test-model at {url}"
    start = result["steps"][0]
    assert start["model_calls"] == 3 and start["answer"] == 2
    assert start["nacks"][0]["case"] == "excludes_refunds"
    paths = [p for p, _ in Chat.requests]
    assert paths == ["/v1/chat/completions"] * 3
    last = json.dumps(Chat.requests[-1][1]["messages"])
    assert "excludes_refunds" in last and '\\"expected\\":1' in last
    assert result["stats"]["generations"] == 3
    # every call's tokens are counted, A's (interpret) included: 3 calls of 15 tokens
    assert start["tokens"] == 45 and result["steps"][1]["tokens"] == 0


def test_demo_text_explains_its_counts_and_shows_tokens(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1"
        out = subprocess.run(
            [sys.executable, "-m", "incr.cli", "demo", "--memory",
             "--model", "openai:test-model", "--base-url", url],
            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "checks run" not in text and "validations" not in text
    assert "A validator run is\none validator judging one candidate" in text
    assert "validator runs: 3;" in text and "validator runs 3," in text
    assert "45 tokens (as the server reported them)" in text
