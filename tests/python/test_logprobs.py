"""Log-probabilities and OpenAI's sampling adjustments from `qspec serve` (issue 52).

Starts `qspec serve MODEL --mode w4a16 --port 0` and checks, with the standard library only:
  * echo with max_tokens 0 (lm-eval's loglikelihood scoring): the prompt's token logprobs sum
    to minus `qspec eval ppl`'s nll_sum of the same text (one window, same mode) within 1e-3,
    a prompt longer than a prefill chunk included; the first token's entry is null;
  * echo with max_tokens 1 and logprobs 1 (what lm-eval's local-completions sends) carries the
    same prompt entries plus the generated token's;
  * greedy output logprobs: each chosen token is its position's most likely one; QSpec (w4a8
    drafts) returns the W4A16 verify's logprobs, equal to plain W4A16's;
  * chat logprobs (content[] with top_logprobs), streaming equal to non-streaming on both
    endpoints, and the 400s for out-of-range values;
  * logit_bias (-100 bans the greedy token, +100 forces one, its logprobs staying the model's),
    presence / frequency penalties;
  * /tokenize add_special_tokens, /tokenizer_info, and the access log in text and JSON.

    python tests/python/test_logprobs.py --qspec build/qspec --model models/gsm-synth-llama
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

ARGS = None
TOLERANCE = 1e-3  # the bound between the server's and qspec's own loglikelihoods
PROMPT = "Question: Sara had 40 dollars and spent 15. How much money is left?\nAnswer:"
TEXTS = [
    "Question: A box holds 12 pens. How many pens are in 4 boxes?\nAnswer: 12*4=<<12*4=48>>48\n#### 48",
    "Question: Dan has 35 coins. Then they give away 27 coins. How many coins does Dan have now?\nAnswer:",
    # Longer than a prefill chunk (256 tokens): scored over several engine steps.
    " ".join(["Question: Tom has 3 apples and buys 5 more. How many apples does he have?\n"
              "Answer: 3+5=<<3+5=8>>8\n#### 8\n"] * 10),
]


class Server:
    def __init__(self, extra=()):
        cmd = [ARGS.qspec, "serve", ARGS.model, "--port", "0", "--mode", "w4a16", "--max-batch-size", "4", *extra]
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
        self.reader = threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True)
        self.reader.start()

    def post(self, path, body):
        """(status, parsed JSON) of a POST."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def get(self, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=60) as response:
            return json.loads(response.read())

    def stream(self, path, body):
        """The parsed data chunks of an SSE response, [DONE] excluded."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                         data=json.dumps({**body, "stream": True}).encode(),
                                         headers={"Content-Type": "application/json"})
        chunks = []
        with urllib.request.urlopen(request, timeout=120) as response:
            for raw in response:
                line = raw.decode().strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[len("data: "):]))
        return chunks

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.reader.join(10)
        self.proc.stderr.close()


def own_nll(text):
    """qspec's own scoring: `qspec eval ppl` of the text in one window, mode w4a16."""
    with tempfile.TemporaryDirectory() as tmp:
        data, out = os.path.join(tmp, "text.txt"), os.path.join(tmp, "ppl.json")
        with open(data, "w") as f:
            f.write(text)
        subprocess.run([ARGS.qspec, "eval", "ppl", ARGS.model, "--data", data, "--modes", "w4a16", "--context", "1024",
                        "-o", out], check=True, capture_output=True)
        with open(out) as f:
            report = json.load(f)
    result = report["results"][0]
    assert result["windows"] == 1, result
    return result["nll_sum"], result["tokens_scored"]


class LogprobsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        cls.server.close()
        assert cls.server.proc.returncode == 0, "".join(cls.server.log)

    def complete(self, **body):
        status, answer = self.server.post("/v1/completions", {"temperature": 0, **body})
        self.assertEqual(status, 200, answer)
        return answer

    def test_echo_scores_equal_qspec_eval_ppl(self):
        for text in TEXTS:
            with self.subTest(text=text[:40]):
                answer = self.complete(prompt=text, max_tokens=0, echo=True, logprobs=1)
                choice = answer["choices"][0]
                self.assertEqual(choice["text"], text)
                self.assertEqual(answer["usage"]["completion_tokens"], 0)
                lp = choice["logprobs"]
                self.assertEqual(len(lp["tokens"]), answer["usage"]["prompt_tokens"])
                self.assertIsNone(lp["token_logprobs"][0])
                self.assertIsNone(lp["top_logprobs"][0])
                nll, scored = own_nll(text)
                self.assertEqual(len(lp["token_logprobs"]) - 1, scored)
                self.assertAlmostEqual(sum(lp["token_logprobs"][1:]), -nll, delta=TOLERANCE)
                # lm-eval's request: max_tokens 1, the prompt's entries then the generated token's.
                lm_eval = self.complete(prompt=text, max_tokens=1, echo=True, logprobs=1)["choices"][0]["logprobs"]
                self.assertEqual(len(lm_eval["token_logprobs"]), len(lp["token_logprobs"]) + 1)
                self.assertEqual(lm_eval["token_logprobs"][:-1], lp["token_logprobs"])
                self.assertEqual(lm_eval["tokens"][:-1], lp["tokens"])
                for token, logprob, top in zip(lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
                    self.assertLessEqual(len(top), 2)  # the best token and the chosen one
                    self.assertEqual(top[token], logprob)
                    self.assertGreaterEqual(max(top.values()), logprob)

    def test_greedy_logprobs_and_qspec_equal_w4a16(self):
        plain = self.complete(prompt=PROMPT, max_tokens=24, logprobs=3)["choices"][0]
        lp = plain["logprobs"]
        self.assertEqual(len(lp["tokens"]), len(lp["token_logprobs"]))
        self.assertEqual("".join(lp["tokens"]), plain["text"])
        offsets = [0]
        for token in lp["tokens"][:-1]:
            offsets.append(offsets[-1] + len(token))
        self.assertEqual(lp["text_offset"], offsets)
        for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
            self.assertLessEqual(logprob, 0.0)
            self.assertEqual(len(top), 3)  # greedy: the chosen token is among the top 3
            self.assertEqual(max(top.values()), logprob)
            self.assertEqual(top[token], logprob)
        qspec = self.complete(prompt=PROMPT, max_tokens=24, logprobs=3,
                              qspec={"mode": "qspec", "draft": "w4a8", "gamma": 4})
        self.assertGreater(qspec["usage"]["qspec"]["drafted"], 0)
        qlp = qspec["choices"][0]["logprobs"]
        self.assertEqual(qspec["choices"][0]["text"], plain["text"])
        self.assertEqual(qlp["tokens"], lp["tokens"])
        for a, b in zip(qlp["token_logprobs"], lp["token_logprobs"]):
            self.assertAlmostEqual(a, b, delta=1e-4)

    def test_chat_logprobs(self):
        body = {"messages": [{"role": "user", "content": "A box holds 12 pens. How many pens are in 4 boxes?"}],
                "max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 2}
        status, answer = self.server.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, answer)
        content = answer["choices"][0]["logprobs"]["content"]
        self.assertEqual(len(content), answer["usage"]["completion_tokens"])
        self.assertEqual("".join(c["token"] for c in content), answer["choices"][0]["message"]["content"])
        for c in content:
            self.assertEqual(bytes(c["bytes"]).decode(), c["token"])
            self.assertEqual(len(c["top_logprobs"]), 2)
            self.assertEqual(c["top_logprobs"][0]["logprob"], c["logprob"])  # greedy
        chunks = self.server.stream("/v1/chat/completions", body)
        streamed = [c for chunk in chunks if chunk["choices"] and chunk["choices"][0]["logprobs"]
                    for c in chunk["choices"][0]["logprobs"]["content"]]
        self.assertEqual(streamed, content)
        status, answer = self.server.post("/v1/chat/completions", {**body, "logprobs": False, "top_logprobs": 0})
        self.assertEqual(status, 200, answer)
        self.assertIsNone(answer["choices"][0]["logprobs"])

    def test_streamed_completion_logprobs_equal_non_streamed(self):
        body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "logprobs": 2, "echo": True}
        full = self.complete(**body)["choices"][0]
        chunks = self.server.stream("/v1/completions", body)
        text, merged = "", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for chunk in chunks:
            if not chunk["choices"]:
                continue
            text += chunk["choices"][0]["text"]
            if chunk["choices"][0]["logprobs"]:
                for key in merged:
                    merged[key] += chunk["choices"][0]["logprobs"][key]
        self.assertEqual(text, full["text"])
        self.assertTrue(text.startswith(PROMPT))
        self.assertEqual(merged, full["logprobs"])

    def test_logit_bias_and_penalties(self):
        plain = self.complete(prompt=PROMPT, max_tokens=8, logprobs=0)["choices"][0]
        _, ids = self.server.post("/tokenize", {"prompt": plain["logprobs"]["tokens"][0], "add_special_tokens": False})
        first = ids["tokens"][0]
        # -100 on the greedy first token: another one comes first.
        banned = self.complete(prompt=PROMPT, max_tokens=8, logprobs=0, logit_bias={str(first): -100})["choices"][0]
        self.assertNotEqual(banned["logprobs"]["tokens"][0], plain["logprobs"]["tokens"][0])
        # +100 on one token: it is every token, and its logprobs stay the model's (raw, not ~0).
        _, seven = self.server.post("/tokenize", {"prompt": "7", "add_special_tokens": False})
        forced = self.complete(prompt=PROMPT, max_tokens=6, logprobs=0, ignore_eos=True,
                               logit_bias={str(seven["tokens"][0]): 100})["choices"][0]
        self.assertEqual(forced["text"], "7" * 6)
        self.assertLess(min(forced["logprobs"]["token_logprobs"]), -1.0)
        # Penalties change a greedy answer that repeats tokens; 0 changes nothing.
        long_body = {"prompt": PROMPT, "max_tokens": 40}
        base = self.complete(**long_body)["choices"][0]["text"]
        self.assertEqual(self.complete(**long_body, presence_penalty=0, frequency_penalty=0)["choices"][0]["text"], base)
        self.assertNotEqual(self.complete(**long_body, frequency_penalty=2)["choices"][0]["text"], base)

    def test_bad_values_are_400(self):
        cases = [
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                                      "top_logprobs": 30}, "top_logprobs"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3},
             "top_logprobs"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "echo": True}, "echo"),
            ("/v1/completions", {"prompt": PROMPT, "logprobs": 21}, "logprobs"),
            ("/v1/completions", {"prompt": PROMPT, "max_tokens": 0}, "max_tokens"),
            ("/v1/completions", {"prompt": PROMPT, "echo": True, "logprobs": 1, "n": 2}, "n"),
            ("/v1/completions", {"prompt": PROMPT, "presence_penalty": 3}, "presence_penalty"),
            ("/v1/completions", {"prompt": PROMPT, "logit_bias": {"99999": 1}}, "logit_bias"),
        ]
        for path, body, param in cases:
            with self.subTest(body=body):
                status, answer = self.server.post(path, body)
                self.assertEqual(status, 400, answer)
                self.assertEqual(answer["error"]["param"], param)
                self.assertEqual(answer["error"]["type"], "invalid_request_error")
                self.assertTrue(answer["error"]["message"])
        self.assertEqual(self.server.get("/health")["status"], "ok")  # still serving

    def test_tokenizer_routes(self):
        info = self.server.get("/tokenizer_info")
        self.assertEqual(info["eos_token"], "<|endoftext|>")
        self.assertEqual(info["model_max_length"], 1024)
        _, with_special = self.server.post("/tokenize", {"prompt": PROMPT})
        _, without = self.server.post("/tokenize", {"prompt": PROMPT, "add_special_tokens": False})
        self.assertEqual(with_special["tokens"][-len(without["tokens"]):], without["tokens"])
        _, text = self.server.post("/detokenize", {"tokens": without["tokens"]})
        self.assertEqual(text["prompt"], PROMPT)

    def test_access_log(self):
        self.complete(prompt=PROMPT, max_tokens=3)
        time.sleep(0.2)
        lines = [line for line in self.server.log if '"/v1/completions" 200 prompt=' in line]
        self.assertTrue(lines, "".join(self.server.log))
        self.assertRegex(lines[-1], r'POST "/v1/completions" 200 prompt=\d+ completion=\d+ \d+\.\d{3}s$')


class JsonLogTest(unittest.TestCase):
    def test_json_access_log(self):
        server = Server(["--log-format", "json"])
        try:
            status, _ = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0})
            self.assertEqual(status, 200)
            status, _ = server.post("/v1/completions", {"prompt": PROMPT, "logprobs": 99})
            self.assertEqual(status, 400)
        finally:
            server.close()
        records = [json.loads(line) for line in server.log if line.startswith("{")]
        self.assertEqual([r["status"] for r in records], [200, 400])
        self.assertEqual(records[0]["route"], "/v1/completions")
        self.assertEqual(records[0]["method"], "POST")
        self.assertEqual(records[0]["completion_tokens"], 2)
        self.assertGreater(records[0]["prompt_tokens"], 0)
        self.assertGreaterEqual(records[0]["latency_s"], 0)
        self.assertIsNone(records[1]["prompt_tokens"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--qspec", required=True)
    parser.add_argument("--model", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
