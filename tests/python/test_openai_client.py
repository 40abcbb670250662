"""The official `openai` Python SDK against `qspec serve` on loopback.

Starts `qspec serve MODEL --port 0` (an ephemeral port), then drives completions (plain and
streamed), streamed chat completions, the model list, error answers and the per-request
QSpec extension through the SDK, and compares the greedy text with `qspec generate`'s
standalone output of the same prompt; with --api-key the right key works and a wrong one
gets 401 (openai.AuthenticationError). Ends with SIGTERM during a stream: the stream finishes
and the server exits 0.

    python tests/python/test_openai_client.py --qspec build/qspec --model models/gsm-synth-llama \
        --chat-template tests/data/chat_templates/llama3.jinja
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request

import openai

ARGS = None
PROMPT = "Question: Sara had 40 dollars and spent 15. How much money is left?\nAnswer:"


class Server:
    def __init__(self, extra=()):
        cmd = [ARGS.qspec, "serve", ARGS.model, "--port", "0", "--max-batch-size", "4",
               "--chat-template", ARGS.chat_template, *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("qspec serve did not start:\n" + "".join(self.log))
        # Keep reading stderr so the pipe never fills.
        self.reader = threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True)
        self.reader.start()
        self.wait_until_answering()
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused",
                                    max_retries=0, timeout=120)

    def wait_until_answering(self):
        # The "listening" line comes after bind(); under a loaded CI machine the first connection of
        # a test once failed right after it (APIConnectionError with max_retries=0). /health needs no
        # key, so poll it until the server answers, and fail with the server's log if it never does.
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=10) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.time() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("qspec serve never answered /health:\n" + "".join(self.log))
            time.sleep(0.2)

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def standalone(prompt, max_tokens):
    """`qspec generate` greedy output in its default mode, which is the server's (`--mode auto`:
    w16a16 on the bundled 16-bit checkpoint, qspec with the planner on a 4-bit one)."""
    out = subprocess.run([ARGS.qspec, "generate", ARGS.model, "-n", str(max_tokens), "-p", prompt],
                         check=True, capture_output=True, text=True).stdout
    assert out.startswith(prompt) and out.endswith("\n"), out
    return out[len(prompt):-1]


class OpenAIClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()
        cls.client = cls.server.client
        cls.model = cls.client.models.list().data[0].id

    @classmethod
    def tearDownClass(cls):
        cls.server.close()
        assert cls.server.proc.returncode == 0, "".join(cls.server.log)

    def test_models(self):
        models = self.client.models.list().data
        self.assertEqual(len(models), 1)
        self.assertEqual(models[0].id, os.path.basename(os.path.normpath(ARGS.model)))

    def test_completion_equals_standalone_generate(self):
        expected = standalone(PROMPT, 32)
        self.assertTrue(expected)
        r = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=32, temperature=0)
        self.assertEqual(r.choices[0].text, expected)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        self.assertGreater(r.usage.completion_tokens, 0)

        chunks = list(self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=32,
                                                     temperature=0, stream=True))
        self.assertGreater(len(chunks), 2)
        self.assertEqual("".join(c.choices[0].text for c in chunks), expected)
        self.assertEqual(chunks[-1].choices[0].finish_reason, r.choices[0].finish_reason)

    def test_streamed_chat(self):
        # The math model ends a chat turn at once; ignore_eos gives it text to stream.
        messages = [{"role": "system", "content": "You are a careful math tutor."},
                    {"role": "user", "content": "A box holds 12 pens. How many pens are in 4 boxes?"}]
        full = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=24,
                                                   temperature=0, extra_body={"ignore_eos": True})
        self.assertEqual(full.choices[0].message.role, "assistant")
        self.assertTrue(full.choices[0].message.content)
        stream = self.client.chat.completions.create(model=self.model, messages=messages, max_tokens=24,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True},
                                                     extra_body={"ignore_eos": True})
        text, finish, usage, roles = "", None, None, []
        for chunk in stream:
            if chunk.usage is not None and not chunk.choices:
                usage = chunk.usage
                continue
            delta = chunk.choices[0].delta
            if delta.role:
                roles.append(delta.role)
            text += delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        self.assertEqual(roles, ["assistant"])
        self.assertEqual(text, full.choices[0].message.content)
        self.assertEqual(finish, full.choices[0].finish_reason)
        self.assertIsNotNone(usage)
        self.assertEqual(usage.completion_tokens, full.usage.completion_tokens)
        self.assertEqual(usage.prompt_tokens, full.usage.prompt_tokens)

    def test_qspec_extension(self):
        # A request names its mode: plain w4a16 here (the 16-bit checkpoint's default is w16a16).
        expected = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=24, temperature=0,
                                                  extra_body={"qspec": {"mode": "w4a16"}}).choices[0].text
        r = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=24, temperature=0,
                                           extra_body={"qspec": {"mode": "qspec", "draft": "w4a8", "gamma": 4}})
        self.assertEqual(r.choices[0].text, expected)  # greedy QSpec == greedy w4a16
        q = r.usage.model_extra["qspec"]
        self.assertGreater(q["drafted"], 0)
        self.assertGreaterEqual(q["acceptance_rate"], 0.0)
        self.assertLessEqual(q["acceptance_rate"], 1.0)

    def test_errors(self):
        with self.assertRaises(openai.NotFoundError) as e:
            self.client.completions.create(model="gpt-nonexistent", prompt=PROMPT, max_tokens=4)
        self.assertEqual(e.exception.body["code"], "model_not_found")
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=0)
        self.assertEqual(e.exception.body["param"], "max_tokens")
        with self.assertRaises(openai.BadRequestError):
            self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=4, temperature="warm")
        # Still serving.
        r = self.client.completions.create(model=self.model, prompt=PROMPT, max_tokens=4, temperature=0)
        self.assertEqual(r.usage.completion_tokens, 4)


class ApiKeyTest(unittest.TestCase):
    def test_right_key_works_and_wrong_key_gets_401(self):
        server = Server(extra=["--api-key", "sk-qspec-test"])
        try:
            base = f"http://127.0.0.1:{server.port}/v1"
            right = openai.OpenAI(base_url=base, api_key="sk-qspec-test", max_retries=0, timeout=120)
            out = right.completions.create(model=right.models.list().data[0].id, prompt=PROMPT, max_tokens=12,
                                           temperature=0)
            self.assertEqual(out.choices[0].text, standalone(PROMPT, 12))
            wrong = openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0, timeout=120)
            with self.assertRaises(openai.AuthenticationError) as caught:
                wrong.completions.create(model="m", prompt=PROMPT, max_tokens=4)
            self.assertEqual(caught.exception.status_code, 401)
            with self.assertRaises(openai.AuthenticationError):
                wrong.models.list()
        finally:
            server.close()


class ShutdownTest(unittest.TestCase):
    def test_sigterm_drains_the_stream_in_flight(self):
        server = Server()
        try:
            stream = server.client.completions.create(model=server.client.models.list().data[0].id, prompt=PROMPT,
                                                      max_tokens=150, temperature=0, stream=True,
                                                      extra_body={"ignore_eos": True})
            it = iter(stream)
            first = next(it)
            server.proc.send_signal(signal.SIGTERM)
            rest = list(it)
            chunks = [first] + rest
            self.assertEqual(chunks[-1].choices[0].finish_reason, "length")
            self.assertGreater(len("".join(c.choices[0].text for c in chunks)), 0)
            self.assertEqual(server.proc.wait(60), 0, "".join(server.log))
            server.reader.join(10)  # the log's last lines (the access log writes one a request before them)
            self.assertTrue(any("stopped: 1 requests finished, 0 cancelled" in line for line in server.log),
                            "".join(server.log))
        finally:
            server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--qspec", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--chat-template", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], "-v", *rest])
