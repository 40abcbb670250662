#!/usr/bin/env python3
"""Load test of `qspec serve` on loopback: N concurrent streaming clients for T seconds.

Starts `qspec serve MODEL --port 0` (or uses --url, loopback only), takes each prompt's
reference output with one request at a time on the idle server (checked against
`qspec generate` for the first --check-generate prompts), then runs --clients threads that
each send streamed greedy completions back to back until --duration seconds or --max-requests
requests have passed. Checks: no 5xx and no transport errors, every stream complete (a
finish_reason and [DONE]) and equal to its prompt's reference text, server RSS flat after
warm-up (--rss-tolerance). Writes bench/results/serve-load-*.json with requests/s, p50/p99
latency and time to first token, the commit and the exact command. Standard library only.

    python3 tools/load_test.py --clients 64 --duration 300
"""
import argparse
import datetime
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def percentile(values, p):
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def rss_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def load_prompts(model_dir, count):
    prompts = []
    path = os.path.join(model_dir, "eval_problems.jsonl")
    with open(path) as f:
        for line in f:
            problem = json.loads(line)
            prompts.append("Question: " + problem["question"].strip() + "\nAnswer:")
            if len(prompts) == count:
                break
    if not prompts:
        raise SystemExit(f"{path}: no problems")
    return prompts


def post(host, port, body, timeout=600):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def stream_once(conn, body):
    """One streamed completion on a kept-alive connection: (status, text, finish, done, ttft, latency)."""
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        resp.read()
        return resp.status, "", None, False, None, time.perf_counter() - start
    text, finish, done, ttft = [], None, False, None
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.decode().rstrip("\r\n")
        if not line.startswith("data: "):
            continue
        payload = line[6:]
        if payload == "[DONE]":
            done = True
            continue
        chunk = json.loads(payload)
        if "error" in chunk:
            finish = "error: " + chunk["error"]["message"]
            continue
        choice = chunk["choices"][0]
        if choice["text"] and ttft is None:
            ttft = time.perf_counter() - start
        text.append(choice["text"])
        finish = choice["finish_reason"] or finish
    resp.read()
    return 200, "".join(text), finish, done, ttft, time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qspec", default=os.path.join(ROOT, "build", "qspec"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "gsm-synth-llama"))
    ap.add_argument("--url", help="an already running server (loopback only); default: start one")
    ap.add_argument("--server-args", default="", help="extra `qspec serve` arguments")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    ap.add_argument("--max-requests", type=int, default=200000, help="stop after this many requests")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=32, help="distinct prompts (eval_problems.jsonl)")
    ap.add_argument("--check-generate", type=int, default=4,
                    help="prompts whose reference is also checked against `qspec generate`")
    ap.add_argument("--warmup", type=float, default=0.15, help="fraction of the run before RSS is tracked")
    ap.add_argument("--rss-tolerance", type=float, default=0.10, help="allowed RSS growth after warm-up")
    ap.add_argument("--out", help="result file (default bench/results/serve-load-<time>.json)")
    args = ap.parse_args()
    if args.clients < 1 or args.clients > 1024 or args.duration <= 0 or args.duration > 3600:
        raise SystemExit("--clients must be in 1..1024 and --duration in (0, 3600]")

    proc, log = None, []
    if args.url:
        u = urllib.parse.urlparse(args.url)
        host, port = u.hostname, u.port or 80
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise SystemExit("--url must be a loopback address")
        server_cmd = None
        pid = None
    else:
        host = "127.0.0.1"
        server_cmd = [args.qspec, "serve", args.model, "--host", host, "--port", "0", *args.server_args.split()]
        proc = subprocess.Popen(server_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port = None
        while True:
            line = proc.stderr.readline()
            if not line:
                raise SystemExit("qspec serve did not start:\n" + "".join(log))
            log.append(line)
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
        pid = proc.pid

    failures = []
    try:
        prompts = load_prompts(args.model, args.prompts)
        # References: each prompt alone on the idle server.
        references = []
        for p in prompts:
            status, data = post(host, port, {"prompt": p, "max_tokens": args.max_tokens, "temperature": 0})
            if status != 200:
                raise SystemExit(f"reference request failed: {status} {data[:300]!r}")
            references.append(json.loads(data)["choices"][0]["text"])
        for i in range(min(args.check_generate, len(prompts))):
            out = subprocess.run([args.qspec, "generate", args.model, "--mode", "w4a16", "-n", str(args.max_tokens),
                                  "-p", prompts[i]], check=True, capture_output=True, text=True).stdout
            standalone = out[len(prompts[i]):-1]
            if standalone != references[i]:
                failures.append(f"prompt {i}: server reference differs from qspec generate")

        lock = threading.Lock()
        records = []  # (start, latency, ttft, status, ok)
        errors = []
        counter = [0]
        t0 = time.time()
        deadline = t0 + args.duration
        rss = []  # (t, bytes)

        def client(index):
            conn = http.client.HTTPConnection(host, port, timeout=600)
            n = index
            while time.time() < deadline:
                with lock:
                    if counter[0] >= args.max_requests:
                        break
                    counter[0] += 1
                k = n % len(prompts)
                n += args.clients
                began = time.time() - t0
                try:
                    status, text, finish, done, ttft, latency = stream_once(
                        conn, {"prompt": prompts[k], "max_tokens": args.max_tokens, "temperature": 0,
                               "stream": True})
                except (OSError, http.client.HTTPException) as e:
                    with lock:
                        errors.append(f"client {index}: {type(e).__name__}: {e}")
                        records.append((began, None, None, -1, False))
                    conn.close()
                    conn = http.client.HTTPConnection(host, port, timeout=600)
                    continue
                ok = status == 200 and done and finish in ("stop", "length") and text == references[k]
                with lock:
                    records.append((began, latency, ttft, status, ok))
                    if status == 200 and not ok and len(errors) < 50:
                        errors.append(f"prompt {k}: done={done} finish={finish} text_equal={text == references[k]}")
            conn.close()

        def sampler():
            while time.time() < deadline + 1 and pid:
                r = rss_bytes(pid)
                if r:
                    rss.append((time.time() - t0, r))
                time.sleep(1.0)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        sampler_thread = threading.Thread(target=sampler, daemon=True)
        sampler_thread.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.time() - t0

        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("GET", "/metrics")
        metrics_text = conn.getresponse().read().decode()
        conn.close()
        metrics = {}
        for line in metrics_text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                metrics[name] = float(value)
    finally:
        if proc:
            proc.terminate()
            try:
                exit_code = proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                exit_code = None

    statuses = {}
    for r in records:
        statuses[str(r[3])] = statuses.get(str(r[3]), 0) + 1
    done_ok = [r for r in records if r[4]]
    latencies = [r[1] for r in done_ok]
    ttfts = [r[2] for r in done_ok if r[2] is not None]
    five_xx = sum(v for k, v in statuses.items() if k.startswith("5"))
    incomplete = sum(1 for r in records if r[3] == 200 and not r[4])
    warm_t = args.duration * args.warmup
    rss_after = [b for t, b in rss if t >= warm_t]
    rss_info = None
    if rss_after:
        rss_info = {"at_warmup_end_mb": rss_after[0] / 2**20, "end_mb": rss_after[-1] / 2**20,
                    "max_after_warmup_mb": max(rss_after) / 2**20,
                    "growth_after_warmup": (max(rss_after) - rss_after[0]) / rss_after[0],
                    "samples": [[round(t, 1), round(b / 2**20, 2)] for t, b in rss]}
        if rss_info["growth_after_warmup"] > args.rss_tolerance:
            failures.append(f"RSS grew {100 * rss_info['growth_after_warmup']:.1f}% after warm-up")
    if five_xx:
        failures.append(f"{five_xx} 5xx answers")
    if errors and any(not e.startswith("prompt") for e in errors):
        failures.append(f"{sum(1 for r in records if r[3] == -1)} transport errors")
    if incomplete:
        failures.append(f"{incomplete} incomplete or mismatching streams")
    if not done_ok:
        failures.append("no request completed")
    if proc and exit_code != 0:
        failures.append(f"server exit code {exit_code}")

    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    result = {
        "benchmark": "serve-load",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit + ("-dirty" if dirty else ""),
        "command": " ".join([sys.executable, *sys.argv]),
        "server_command": " ".join(server_cmd) if server_cmd else args.url,
        "host": {"cpus": os.cpu_count(), "load_average_at_end": os.getloadavg()},
        "config": {"clients": args.clients, "duration_s": args.duration, "max_tokens": args.max_tokens,
                   "prompts": len(prompts), "max_requests": args.max_requests, "temperature": 0, "stream": True},
        "results": {
            "elapsed_s": elapsed,
            "requests": len(records),
            "completed_ok": len(done_ok),
            "requests_per_second": len(done_ok) / elapsed,
            "generated_tokens_per_second": metrics.get("qspec_generated_tokens_total", 0) / elapsed,
            "latency_s": {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99),
                          "mean": statistics.mean(latencies) if latencies else None},
            "ttft_s": {"p50": percentile(ttfts, 50), "p99": percentile(ttfts, 99)},
            "status_counts": statuses,
            "five_xx": five_xx,
            "incomplete_or_mismatch": incomplete,
            "transport_errors": sum(1 for r in records if r[3] == -1),
            "server_exit_code": exit_code if proc else None,
            "rss": rss_info,
            "server_metrics": {k: v for k, v in metrics.items() if not k.startswith("qspec_batch_size")},
        },
        "errors": errors[:50],
        "failures": failures,
        "passed": not failures,
    }
    out = args.out or os.path.join(ROOT, "bench", "results",
                                   "serve-load-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + ".json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    r = result["results"]
    print(f"{r['completed_ok']}/{r['requests']} ok in {elapsed:.1f}s: {r['requests_per_second']:.2f} req/s, "
          f"latency p50 {r['latency_s']['p50']} p99 {r['latency_s']['p99']}, "
          f"TTFT p50 {r['ttft_s']['p50']} p99 {r['ttft_s']['p99']}, statuses {statuses}")
    if rss_info:
        print(f"RSS after warm-up {rss_info['at_warmup_end_mb']:.1f} MB -> end {rss_info['end_mb']:.1f} MB "
              f"(max {rss_info['max_after_warmup_mb']:.1f} MB)")
    print("wrote", out)
    if failures:
        print("FAILED:", "; ".join(failures))
        return 1
    print("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
