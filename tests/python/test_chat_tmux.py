#!/usr/bin/env python3
"""`qspec chat` driven through tmux as a person would use it: wait for the prompt, type a
question, read the streamed answer, /reset, /exit. The answer must be the bundled model's
greedy completion of the same question in its Question/Answer form (`qspec generate`), since
its chat template renders a user turn that way. Standard library only; needs tmux."""
import argparse
import shutil
import subprocess
import sys
import time

QUESTION = "Tom has 3 apples and buys 5 more. How many apples does he have?"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--qspec", required=True)
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        print("FAIL: tmux is not installed (scripts/install-deps.sh installs it)")
        return 1

    expected = subprocess.run(
        [args.qspec, "generate", args.model, "-p", f"Question: {QUESTION}\nAnswer:", "-n", "24", "--temperature", "0"],
        check=True, capture_output=True, text=True).stdout
    first_line = expected.split("Answer:", 1)[1].strip().splitlines()[0]

    session = f"qspec-chat-test-{int(time.time() * 1000) % 10**9}"
    tmux = ["tmux", "-L", session]  # a server of its own: never the user's sessions

    def pane():
        return subprocess.run(tmux + ["capture-pane", "-p", "-J", "-t", session], capture_output=True,
                              text=True).stdout

    def wait_for(predicate, what, seconds=60):
        deadline = time.time() + seconds
        while time.time() < deadline:
            text = pane()
            if predicate(text):
                return text
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; the pane holds:\n{pane()}")

    def prompts(text):
        return sum(1 for line in text.splitlines() if line.startswith(">"))

    command = f"'{args.qspec}' chat '{args.model}' --temperature 0 -n 24"
    subprocess.run(tmux + ["new-session", "-d", "-s", session, "-x", "220", "-y", "60", command], check=True)
    try:
        wait_for(lambda t: prompts(t) >= 1, "the first prompt")
        subprocess.run(tmux + ["send-keys", "-t", session, "-l", QUESTION], check=True)
        subprocess.run(tmux + ["send-keys", "-t", session, "Enter"], check=True)
        text = wait_for(lambda t: prompts(t) >= 2, "the answer and the next prompt")
        assert first_line in text, f"expected the answer's first line {first_line!r} in:\n{text}"
        subprocess.run(tmux + ["send-keys", "-t", session, "-l", "/reset"], check=True)
        subprocess.run(tmux + ["send-keys", "-t", session, "Enter"], check=True)
        wait_for(lambda t: "[conversation reset]" in t and prompts(t) >= 3, "/reset")
        subprocess.run(tmux + ["send-keys", "-t", session, "-l", "/exit"], check=True)
        subprocess.run(tmux + ["send-keys", "-t", session, "Enter"], check=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            if subprocess.run(tmux + ["has-session", "-t", session], capture_output=True).returncode != 0:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("/exit did not end the chat")
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)
    print(f"OK: the streamed answer began {first_line!r}; /reset and /exit worked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
