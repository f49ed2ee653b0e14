"""A stand-in for a vLLM or SGLang server in tests: the same routes and response shapes, no model.

The tests copy this file to `<tmp>/vllm/entrypoints/openai/api_server.py` or `<tmp>/sglang/launch_server.py`
and put `<tmp>` on the server's PYTHONPATH, so the adapters launch it with their real argv
(`python -m vllm.entrypoints.openai.api_server …` / `python -m sglang.launch_server …`).

Generation is deterministic: request r's token i is (last prompt id + 1 + i) mod 1000; step s accepts
ACCEPT_PATTERN[s % 4] drafts (capped at γ), so a step emits accepted + 1 tokens. Routes:
  GET  /health /v1/models /version /server_info /metrics (vLLM spec-decode counters, cumulative)
  POST /v1/completions (OpenAI streaming; vLLM shape: token_ids per chunk, a final usage chunk with
       metrics.speculative_decoding when --per-request-spec-decode-metrics is given)
  POST /generate       (SGLang native streaming: cumulative text/output_ids, meta_info with spec_* counts)
`--fail-start` in argv: print an error and exit 3 before serving.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ACCEPT_PATTERN = (2, 0, 1, 3)
ARGV = sys.argv[1:]


def _arg(name, default=None):
    return ARGV[ARGV.index(name) + 1] if name in ARGV else default


if "--fail-start" in ARGV:
    print("fake engine: refusing to start (--fail-start)", flush=True)
    print("ValueError: this configuration is not supported", flush=True)
    sys.exit(3)

def _args(name):
    """The values after `name` up to the next flag (vLLM's --served-model-name takes several)."""
    if name not in ARGV:
        return []
    rest = ARGV[ARGV.index(name) + 1:]
    return rest[:next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))]


PORT = int(_arg("--port", "8000"))
SERVED = _args("--served-model-name") or ["fake-model"]
SPEC = json.loads(_arg("--speculative-config", "null") or "null")
GAMMA = int(SPEC["num_speculative_tokens"]) if SPEC else int(_arg("--speculative-num-steps", "0"))
PER_REQUEST = _arg("--per-request-spec-decode-metrics")
COUNTERS = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": [0] * max(GAMMA, 1)}
LOCK = threading.Lock()


def plan(prompt, max_tokens):
    """Token ids and per-step accepted counts of one request."""
    start = (prompt[-1] if prompt else 0) + 1
    tokens = [(start + i) % 1000 for i in range(max_tokens)]
    steps, emitted, s = [], 1, 0  # the first token comes from prefill
    while GAMMA and emitted < max_tokens:
        a = min(ACCEPT_PATTERN[s % len(ACCEPT_PATTERN)], GAMMA)
        steps.append(a)
        emitted += a + 1
        s += 1
    groups, i = [[tokens[0]]], 1
    for a in steps:
        groups.append(tokens[i:i + a + 1])
        i += a + 1
    if not GAMMA:
        groups = [[t] for t in tokens]
    return [g for g in groups if g], steps


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _json(self, obj, status=200):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._json({})
        elif self.path == "/v1/models":
            self._json({"data": [{"id": name} for name in SERVED]})
        elif self.path in ("/version", "/server_info", "/get_server_info"):
            self._json({"version": "fake-1.0"})
        elif self.path == "/metrics":
            with LOCK:
                c = dict(COUNTERS, per_pos=list(COUNTERS["per_pos"]))
            lines = ["# TYPE vllm:spec_decode_num_drafts_total counter"]
            if GAMMA:
                lines += [f'vllm:spec_decode_num_drafts_total{{model_name="fake-model"}} {c["drafts"]}',
                          f'vllm:spec_decode_num_draft_tokens_total{{model_name="fake-model"}} {c["draft_tokens"]}',
                          f'vllm:spec_decode_num_accepted_tokens_total{{model_name="fake-model"}} {c["accepted"]}']
                lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="fake-model",position="{k}"}} {n}'
                          for k, n in enumerate(c["per_pos"][:GAMMA])]
            body = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._json({"error": "not found"}, 404)

    def _stream(self, events):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for event in events:
            self.wfile.write(f"data: {event}\n\n".encode())
            self.wfile.flush()
        self.close_connection = True

    def _count(self, steps):
        with LOCK:
            for a in steps:
                COUNTERS["drafts"] += 1
                COUNTERS["draft_tokens"] += GAMMA
                COUNTERS["accepted"] += a
                for k in range(a):
                    COUNTERS["per_pos"][k] += 1

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/v1/completions":
            prompt = body["prompt"]
            groups, steps = plan(prompt, int(body["max_tokens"]))
            self._count(steps)
            events = []
            for n, group in enumerate(groups):
                last = n == len(groups) - 1
                choice = {"index": 0, "text": " ".join(map(str, group)) + " ", "finish_reason": "length" if last else None}
                if body.get("return_token_ids"):
                    choice["token_ids"] = group
                events.append(json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [choice]}))
            usage = {"prompt_tokens": len(prompt), "completion_tokens": sum(map(len, groups))}
            final = {"id": "cmpl-1", "object": "text_completion", "choices": [], "usage": usage}
            if PER_REQUEST and GAMMA:
                hist = [steps.count(k) for k in range(GAMMA + 1)]
                spec = {"mean_acceptance_length": 1 + sum(steps) / len(steps) if steps else 1.0,
                        "draft_acceptance_rate": sum(steps) / (GAMMA * len(steps)) if steps else 0.0,
                        "acceptance_histogram": hist, "num_spec_steps": len(steps),
                        "num_accepted_draft_tokens": sum(steps), "num_draft_tokens": GAMMA * len(steps),
                        "num_spec_tokens": GAMMA}
                if PER_REQUEST == "detailed":
                    spec |= {"per_step_accepted": steps, "per_step_drafted": [GAMMA] * len(steps)}
                final["metrics"] = {"speculative_decoding": spec}
            if (body.get("stream_options") or {}).get("include_usage"):
                events.append(json.dumps(final))
            self._stream(events + ["[DONE]"])
        elif self.path == "/generate":
            prompt = body["input_ids"]
            params = body.get("sampling_params") or {}
            groups, steps = plan(prompt, int(params.get("max_new_tokens", 16)))
            ids, events = [], []
            for n, group in enumerate(groups):
                ids = ids + group
                last = n == len(groups) - 1
                meta = {"id": body.get("rid"), "prompt_tokens": len(prompt), "completion_tokens": len(ids),
                        "finish_reason": {"type": "length", "length": len(ids)} if last else None}
                if GAMMA and last:  # SGLang >= 0.5 names, with the backward-compatible aliases
                    hist = [steps.count(k) for k in range(GAMMA + 1)]
                    meta |= {"spec_verify_ct": len(steps), "spec_num_correct_drafts": sum(steps),
                             "spec_accepted_drafts": sum(steps), "spec_num_proposed_drafts": GAMMA * len(steps),
                             "spec_proposed_drafts": GAMMA * len(steps), "spec_correct_drafts_histogram": hist,
                             "spec_accept_histogram": hist, "spec_accept_rate": sum(steps) / max(GAMMA * len(steps), 1),
                             "spec_accept_length": len(ids) / max(len(steps), 1)}
                events.append(json.dumps({"text": " ".join(map(str, ids)), "output_ids": list(ids), "meta_info": meta}))
            self._stream(events + ["[DONE]"])
        else:
            self._json({"error": "not found"}, 404)


print(f"fake engine listening on {PORT} (gamma {GAMMA})", flush=True)
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
