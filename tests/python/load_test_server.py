"""A bounded load test of `qspec serve` on loopback: 64 well-behaved clients and 64 hostile ones
at the same time (issue 48).

Starts `qspec serve MODEL --port 0`, takes each prompt's greedy completion alone first, then
runs at once:
  * 64 well-behaved clients: greedy completions (half streamed), each must come back 200 with
    the same text as alone;
  * 64 hostile ones: slow headers (a byte every 0.5 s), gzip bombs, chunked bodies over the
    cap, invalid UTF-8 in the path and the body, streams dropped mid-way, garbage bytes.
Checks that no answer is a 5xx, the hostile requests get their 4xx (or are closed), the
server still answers afterwards, and reports its peak RSS (VmHWM), which must stay under a
bound. Standard library only.

    python3 tests/python/load_test_server.py --qspec build/qspec --model models/gsm-synth-llama
"""
import argparse
import gzip
import http.client
import json
import re
import select
import socket
import subprocess
import sys
import threading
import time

PROMPTS = [
    "Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:",
    "Question: Sara had 40 dollars and spent 15. How much money is left?\nAnswer:",
    "Question: Dan has 35 coins. Then they give away 27 coins. How many coins does Dan have now?\nAnswer:",
    "Question: A box holds 6 eggs. How many eggs are in 4 boxes?\nAnswer:",
]
MAX_TOKENS = 24
GOOD, HOSTILE = 64, 64
RSS_BOUND_MIB = 2048


class Failures:
    def __init__(self):
        self.lock = threading.Lock()
        self.items = []
        self.statuses = {}

    def add(self, what):
        with self.lock:
            self.items.append(what)

    def status(self, kind, status):
        with self.lock:
            self.statuses.setdefault(kind, []).append(status)


def start_server(args):
    cmd = [args.qspec, "serve", args.model, "--port", "0", "--max-batch-size", "16", "--request-timeout", "4",
           "--max-body-bytes", str(1 << 20)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    log = []
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        log.append(line)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
            return proc, int(m.group(1)), log
    proc.kill()
    raise RuntimeError("qspec serve did not start:\n" + "".join(log))


def completion(port, prompt, stream, timeout=120):
    body = json.dumps({"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    res = conn.getresponse()
    raw = res.read().decode("utf-8", "replace")
    conn.close()
    if res.status != 200:
        return res.status, raw
    if not stream:
        return 200, json.loads(raw)["choices"][0]["text"]
    text = ""
    for event in raw.split("\n\n"):
        if not event.startswith("data: ") or event == "data: [DONE]":
            continue
        chunk = json.loads(event[6:])
        if chunk.get("choices"):
            text += chunk["choices"][0].get("text", "")
    return 200, text


def raw_exchange(port, data, read_seconds=20, send_gap=None):
    """Sends bytes (one at a time every send_gap seconds when set); returns what came back."""
    s = socket.create_connection(("127.0.0.1", port), timeout=read_seconds)
    out = b""
    try:
        if send_gap is None:
            s.sendall(data)
        else:
            for i in range(len(data)):
                if select.select([s], [], [], 0)[0]:
                    break  # the server answered (or closed): read it
                s.sendall(data[i:i + 1])
                time.sleep(send_gap)
        s.settimeout(read_seconds)
        while True:
            piece = s.recv(65536)
            if not piece:
                break
            out += piece
    except (ConnectionError, socket.timeout, OSError):
        pass
    finally:
        s.close()
    return out


def status_of(response):
    m = re.match(rb"HTTP/1\.1 (\d{3})", response)
    return int(m.group(1)) if m else 0


def hostile(kind, port, failures):
    if kind == "slow_headers":
        head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
        out = raw_exchange(port, head, read_seconds=30, send_gap=0.5)
        failures.status(kind, status_of(out))
    elif kind == "gzip_bomb":
        body = gzip.compress(b'{"prompt": "hi", "max_tokens": 4' + b" " * (64 << 20) + b"}", 1)
        head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body)).encode()
        failures.status(kind, status_of(raw_exchange(port, head + body)))
    elif kind == "chunked_over_cap":
        piece = b" " * 65536
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(40))
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        failures.status(kind, status_of(raw_exchange(port, head + b"f\r\n{\"prompt\": \"hi\"\r\n" + chunks + b"0\r\n\r\n")))
    elif kind == "bad_utf8":
        out = raw_exchange(port, b"GET /%FF\xfe\xff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        failures.status(kind, status_of(out))
        body = b'{"prompt": "a\xff\xfe", "max_tokens": 4}'
        out = raw_exchange(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        failures.status(kind, status_of(out))
    elif kind == "drop_stream":
        body = json.dumps({"prompt": PROMPTS[0], "max_tokens": 200, "stream": True, "ignore_eos": True}).encode()
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        first = s.recv(4096)
        failures.status(kind, status_of(first))
        s.close()
    elif kind == "garbage":
        out = raw_exchange(port, bytes(range(256)) * 8 + b"\r\n\r\n")
        failures.status(kind, status_of(out))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--qspec", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    proc, port, log = start_server(args)
    failures = Failures()
    try:
        alone = {}
        for prompt in PROMPTS:
            status, text = completion(port, prompt, stream=False)
            assert status == 200, (status, text)
            alone[prompt] = text

        def good(i):
            prompt = PROMPTS[i % len(PROMPTS)]
            try:
                status, text = completion(port, prompt, stream=i % 2 == 1)
            except Exception as e:  # noqa: BLE001 - any failure of a good client is reported
                failures.add("good client %d: %r" % (i, e))
                return
            failures.status("good", status)
            if status != 200:
                failures.add("good client %d: HTTP %d %s" % (i, status, text[:200]))
            elif text != alone[prompt]:
                failures.add("good client %d: text %r differs from alone %r" % (i, text, alone[prompt]))

        kinds = ["slow_headers", "gzip_bomb", "chunked_over_cap", "bad_utf8", "drop_stream", "garbage"]
        threads = [threading.Thread(target=hostile, args=(kinds[i % len(kinds)], port, failures)) for i in range(HOSTILE)]
        threads += [threading.Thread(target=good, args=(i,)) for i in range(GOOD)]
        start = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=max(1.0, 240 - (time.time() - start)))
        elapsed = time.time() - start
        if any(t.is_alive() for t in threads):
            failures.add("clients still running after 240 s")

        # Afterwards the server answers as before.
        for prompt in PROMPTS:
            status, text = completion(port, prompt, stream=False)
            if status != 200 or text != alone[prompt]:
                failures.add("after the load: %d %r" % (status, text))
        with open("/proc/%d/status" % proc.pid) as f:
            hwm = int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) // 1024
        expected = {"slow_headers": {408}, "gzip_bomb": {413}, "chunked_over_cap": {413}, "bad_utf8": {400, 404},
                    "drop_stream": {200}, "garbage": {400, 0}, "good": {200}}
        for kind, statuses in sorted(failures.statuses.items()):
            if any(s >= 500 for s in statuses):
                failures.add("%s: a 5xx answer: %s" % (kind, statuses))
            wrong = [s for s in statuses if s not in expected[kind]]
            if wrong:
                failures.add("%s: unexpected statuses %s" % (kind, wrong))
            print("%-17s %3d answers: %s" % (kind, len(statuses), sorted(set(statuses))))
        if hwm > RSS_BOUND_MIB:
            failures.add("peak RSS %d MiB over %d MiB" % (hwm, RSS_BOUND_MIB))
        print("load: %d good + %d hostile clients in %.1f s; server peak RSS %d MiB" % (GOOD, HOSTILE, elapsed, hwm))
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    if proc.returncode != 0:
        failures.add("qspec serve exited %s after SIGTERM:\n%s" % (proc.returncode, "".join(log[-20:])))
    for f in failures.items:
        print("FAIL:", f)
    print("load test:", "FAILED" if failures.items else "ok")
    return 1 if failures.items else 0


if __name__ == "__main__":
    sys.exit(main())
