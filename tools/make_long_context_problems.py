#!/usr/bin/env python3
"""Long-context prompts for QSpec acceptance (issue 50): WikiText-2 test articles, each cut to
about --words words and followed by a request to summarise it, as `qspec eval qspec` problems
({"question", "answer": ""}). A draft with a sparse view of the cache (--draft-window) reads only
the end and the sinks of such a prompt; its acceptance here is what the GPU bench replays.

    python3 tools/make_long_context_problems.py data/wikitext-2/wiki.test.raw --words 1500 \
        --count 16 > /tmp/long-context.jsonl

--request replaces the summary request: with "Repeat the text above word for word." and short
passages the answers repeat their prompts, the text prompt lookup (--draft ngram) is for.
"""
import argparse
import json
import re
import sys


def articles(text):
    """(title, body) of each top-level article (' = Title = ' lines)."""
    parts = re.split(r"^ = ([^=].*?) = \s*$", text, flags=re.M)
    for i in range(1, len(parts) - 1, 2):
        yield parts[i].strip(), parts[i + 1]


def clean(body):
    body = re.sub(r"^ =+ (.*?) =+ \s*$", r"\1", body, flags=re.M)  # section headings as plain lines
    body = body.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
    body = re.sub(r" ([.,;:!?')])", r"\1", body)
    body = re.sub(r"([(]) ", r"\1", body)
    return re.sub(r"\n\s*\n+", "\n\n", body).strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw", help="wiki.test.raw (data/wikitext-2)")
    parser.add_argument("--words", type=int, default=1500, help="words of article a prompt (about 1.3 tokens each)")
    parser.add_argument("--count", type=int, default=16, help="prompts")
    parser.add_argument("--request", default="Summarize the article above in three sentences.",
                        help="what the prompt asks after the passage")
    args = parser.parse_args()
    with open(args.raw, encoding="utf-8") as f:
        text = f.read()
    made = 0
    for title, body in articles(text):
        words = clean(body).split(" ")
        if len(words) < args.words:
            continue
        passage = " ".join(words[: args.words])
        question = f"{title}\n\n{passage}\n\n{args.request}"
        print(json.dumps({"question": question, "answer": ""}))
        made += 1
        if made == args.count:
            break
    if made < args.count:
        sys.exit(f"only {made} articles have {args.words} words or more")


if __name__ == "__main__":
    main()
